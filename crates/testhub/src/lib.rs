//! A local Hugging Face hub for tests: it serves the repositories under a directory with
//! the hub's download protocol, and lets a test break it in the ways the real one breaks.
//!
//! The protocol is the part of the hub that downloads use, as the official
//! `huggingface_hub` client speaks it (`scripts/check-testhub-with-hf-client.sh` runs that
//! client against this server):
//!
//! - `GET /api/models/{repo}[/revision/{rev}]`: the commit and the file names;
//! - `GET /api/models/{repo}/tree/{rev}[/{dir}]?recursive=true`: files with sizes, git ids
//!   and LFS SHA-256s, paginated with a `Link: <...>; rel="next"` header;
//! - `HEAD|GET /{repo}/resolve/{rev}/{path}`: small files served here with `X-Repo-Commit`
//!   and `ETag`; LFS files answered `302` to a signed URL on a second listener (the CDN),
//!   with `X-Linked-Etag` and `X-Linked-Size`;
//! - the CDN serves byte ranges and refuses expired or altered signatures with 403;
//! - errors carry `X-Error-Code` (`RepoNotFound`, `GatedRepo`, `RevisionNotFound`,
//!   `EntryNotFound`) and `X-Error-Message` as the hub's do.
//!
//! Faults ([`Faults`]) make the next requests of a kind fail with a status, cut CDN bodies
//! short, corrupt them, or expire every signed URL; [`Stats`] counts what was served, to
//! whom, and whether a token ever reached the CDN.

mod cdn;
mod repo;
mod server;

pub use repo::{Repo, RepoFile};

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

/// Which part of the hub a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `/api/...`: revisions, model info, trees.
    Api,
    /// `/{repo}/resolve/...`.
    Resolve,
    /// The CDN's byte-serving listener.
    Cdn,
}

/// What the server has served since it started or was last reset.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Requests by kind, faulted ones included.
    pub requests: BTreeMap<Kind, u64>,
    /// Body bytes the CDN sent, by client address.
    pub cdn_bytes_by_ip: BTreeMap<IpAddr, u64>,
    /// Body bytes the CDN sent, by repository path of the file.
    pub cdn_bytes_by_file: BTreeMap<String, u64>,
    /// Whether any CDN request carried an `Authorization` header (the token must stay on
    /// the hub's own origin).
    pub cdn_saw_authorization: bool,
    /// Injected status answers served.
    pub faults_served: u64,
    /// CDN bodies cut short.
    pub cuts_served: u64,
    /// CDN bodies served corrupted.
    pub corruptions_served: u64,
    /// The most CDN bodies in flight at once.
    pub peak_cdn_streams: usize,
}

impl Stats {
    /// All body bytes the CDN sent.
    pub fn cdn_bytes(&self) -> u64 {
        self.cdn_bytes_by_ip.values().sum()
    }

    /// Body bytes the CDN sent to one address.
    pub fn cdn_bytes_to(&self, ip: IpAddr) -> u64 {
        self.cdn_bytes_by_ip.get(&ip).copied().unwrap_or(0)
    }

    /// Requests of one kind.
    pub fn requests_of(&self, kind: Kind) -> u64 {
        self.requests.get(&kind).copied().unwrap_or(0)
    }
}

#[derive(Debug, Default)]
struct FaultState {
    /// Kind → (answers left, status).
    fail: HashMap<Kind, (u32, u16)>,
    /// (bodies left, bytes each sends before the connection drops).
    cut: Option<(u32, u64)>,
    /// Bodies left to corrupt.
    corrupt: u32,
    /// The `Retry-After` seconds sent with injected 429/503 answers.
    retry_after: Option<u64>,
}

/// Who may see what.
#[derive(Debug, Default, Clone)]
struct Access {
    /// Repository → tokens granted access; files need one of them.
    gated: HashMap<String, Vec<String>>,
    /// Repository → tokens that may see it at all.
    private: HashMap<String, Vec<String>>,
    /// Tokens that are valid but grant nothing special.
    plain: Vec<String>,
}

impl Access {
    fn known(&self, token: &str) -> bool {
        self.plain.iter().any(|t| t == token)
            || self
                .gated
                .values()
                .chain(self.private.values())
                .flatten()
                .any(|t| t == token)
    }
}

pub(crate) struct State {
    root: PathBuf,
    repos: RwLock<BTreeMap<String, Repo>>,
    access: Access,
    page_size: usize,
    api_url: String,
    cdn_url: String,
    /// Signs CDN URLs; changing it expires every URL handed out.
    secret: AtomicU64,
    faults: Mutex<FaultState>,
    stats: Mutex<Stats>,
    streams: AtomicUsize,
    /// Bytes per second each CDN body is held to; 0 for as fast as it goes.
    stream_rate: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    pub(crate) fn count(&self, kind: Kind) {
        *lock(&self.stats).requests.entry(kind).or_default() += 1;
    }

    /// The injected status for this request, if one is due.
    pub(crate) fn take_fault(&self, kind: Kind) -> Option<(u16, Option<u64>)> {
        let mut f = lock(&self.faults);
        let retry_after = f.retry_after;
        let (left, status) = f.fail.get_mut(&kind)?;
        if *left == 0 {
            return None;
        }
        *left -= 1;
        let status = *status;
        drop(f);
        lock(&self.stats).faults_served += 1;
        Some((status, retry_after))
    }

    /// The cut and corruption this CDN body gets.
    pub(crate) fn take_body_faults(&self) -> (Option<u64>, bool) {
        let mut f = lock(&self.faults);
        let cut = match &mut f.cut {
            Some((left, at)) if *left > 0 => {
                *left -= 1;
                Some(*at)
            }
            _ => None,
        };
        let corrupt = f.corrupt > 0;
        if corrupt {
            f.corrupt -= 1;
        }
        drop(f);
        let mut s = lock(&self.stats);
        s.cuts_served += u64::from(cut.is_some());
        s.corruptions_served += u64::from(corrupt);
        (cut, corrupt)
    }

    pub(crate) fn sent(&self, ip: IpAddr, file: &str, n: u64) {
        let mut s = lock(&self.stats);
        *s.cdn_bytes_by_ip.entry(ip).or_default() += n;
        *s.cdn_bytes_by_file.entry(file.to_string()).or_default() += n;
    }

    pub(crate) fn saw_authorization(&self) {
        lock(&self.stats).cdn_saw_authorization = true;
    }

    pub(crate) fn stream_started(&self) {
        let now = self.streams.fetch_add(1, Ordering::SeqCst) + 1;
        let mut s = lock(&self.stats);
        s.peak_cdn_streams = s.peak_cdn_streams.max(now);
    }

    pub(crate) fn stream_ended(&self) {
        self.streams.fetch_sub(1, Ordering::SeqCst);
    }

    pub(crate) fn stream_rate(&self) -> u64 {
        self.stream_rate.load(Ordering::Relaxed)
    }

    pub(crate) fn secret(&self) -> u64 {
        self.secret.load(Ordering::SeqCst)
    }

    pub(crate) fn repo(&self, id: &str) -> Option<Repo> {
        self.repos
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    /// The file with this SHA-256, in any repository.
    pub(crate) fn blob(&self, sha256: &str) -> Option<RepoFile> {
        let repos = self.repos.read().unwrap_or_else(|e| e.into_inner());
        repos
            .values()
            .flat_map(|r| r.files.values())
            .find(|f| f.sha256 == sha256)
            .cloned()
    }
}

/// Sets up a [`TestHub`].
#[derive(Debug)]
pub struct Builder {
    root: PathBuf,
    access: Access,
    page_size: usize,
    bind: IpAddr,
    api_port: u16,
    cdn_port: u16,
    retry_after: Option<u64>,
}

impl Builder {
    /// `repo`'s files need one of `tokens` (a gated repository whose access was granted
    /// to their owners); its listing stays public.
    pub fn gated(mut self, repo: &str, tokens: &[&str]) -> Builder {
        let t = tokens.iter().map(|t| t.to_string()).collect();
        self.access.gated.insert(repo.to_string(), t);
        self
    }

    /// `repo` exists only for `tokens`; anyone else is told it does not exist.
    pub fn private(mut self, repo: &str, tokens: &[&str]) -> Builder {
        let t = tokens.iter().map(|t| t.to_string()).collect();
        self.access.private.insert(repo.to_string(), t);
        self
    }

    /// A valid token that grants nothing special.
    pub fn token(mut self, token: &str) -> Builder {
        self.access.plain.push(token.to_string());
        self
    }

    /// Tree listings come in pages of this many entries.
    pub fn page_size(mut self, n: usize) -> Builder {
        self.page_size = n.max(1);
        self
    }

    /// The address both listeners bind (loopback by default).
    pub fn bind(mut self, ip: IpAddr) -> Builder {
        self.bind = ip;
        self
    }

    /// The API's port (0, the default, picks a free one).
    pub fn api_port(mut self, port: u16) -> Builder {
        self.api_port = port;
        self
    }

    /// The CDN's port (0, the default, picks a free one).
    pub fn cdn_port(mut self, port: u16) -> Builder {
        self.cdn_port = port;
        self
    }

    /// `Retry-After` seconds on injected 429 and 503 answers.
    pub fn retry_after(mut self, secs: u64) -> Builder {
        self.retry_after = Some(secs);
        self
    }

    /// Reads the repositories and starts serving on a background runtime.
    pub fn start(self) -> std::io::Result<TestHub> {
        let api = std::net::TcpListener::bind((self.bind, self.api_port))?;
        let cdn = std::net::TcpListener::bind((self.bind, self.cdn_port))?;
        api.set_nonblocking(true)?;
        cdn.set_nonblocking(true)?;
        let (api_addr, cdn_addr) = (api.local_addr()?, cdn.local_addr()?);
        let repos = repo::scan_root(&self.root)?;
        let state = Arc::new(State {
            root: self.root,
            repos: RwLock::new(repos),
            access: self.access,
            page_size: self.page_size,
            api_url: format!("http://{api_addr}"),
            cdn_url: format!("http://{cdn_addr}"),
            secret: AtomicU64::new(0x5eed_0fc0_ffee),
            faults: Mutex::new(FaultState {
                retry_after: self.retry_after,
                ..FaultState::default()
            }),
            stats: Mutex::new(Stats::default()),
            streams: AtomicUsize::new(0),
            stream_rate: AtomicU64::new(0),
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("testhub")
            .enable_all()
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let s = state.clone();
        let thread = std::thread::Builder::new()
            .name("testhub".into())
            .spawn(move || {
                rt.block_on(async move {
                    let api = tokio::net::TcpListener::from_std(api);
                    let cdn = tokio::net::TcpListener::from_std(cdn);
                    let (Ok(api), Ok(cdn)) = (api, cdn) else {
                        tracing::error!("test hub could not take its listeners");
                        return;
                    };
                    let api_app = server::router(s.clone())
                        .into_make_service_with_connect_info::<SocketAddr>();
                    let cdn_app =
                        cdn::router(s).into_make_service_with_connect_info::<SocketAddr>();
                    tokio::select! {
                        r = axum::serve(api, api_app) => tracing::warn!(?r, "test hub API ended"),
                        r = axum::serve(cdn, cdn_app) => tracing::warn!(?r, "test hub CDN ended"),
                        _ = stopped => {}
                    }
                });
                rt.shutdown_background();
            })?;
        Ok(TestHub {
            state,
            api_addr,
            cdn_addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

/// A running test hub; dropping it stops the server.
#[derive(Debug)]
pub struct TestHub {
    state: Arc<State>,
    api_addr: SocketAddr,
    cdn_addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("root", &self.root)
            .field("api_url", &self.api_url)
            .finish_non_exhaustive()
    }
}

impl TestHub {
    /// A hub serving `root/OWNER/NAME/...`.
    pub fn builder(root: impl AsRef<Path>) -> Builder {
        Builder {
            root: root.as_ref().to_path_buf(),
            access: Access::default(),
            page_size: 1000,
            bind: IpAddr::from([127, 0, 0, 1]),
            api_port: 0,
            cdn_port: 0,
            retry_after: None,
        }
    }

    /// What `HF_ENDPOINT` should be set to.
    pub fn endpoint(&self) -> String {
        self.state.api_url.clone()
    }

    /// The API listener's address.
    pub fn api_addr(&self) -> SocketAddr {
        self.api_addr
    }

    /// The CDN listener's address.
    pub fn cdn_addr(&self) -> SocketAddr {
        self.cdn_addr
    }

    /// Injects faults into the requests that follow.
    pub fn faults(&self) -> Faults<'_> {
        Faults(&self.state)
    }

    /// What was served so far.
    pub fn stats(&self) -> Stats {
        lock(&self.state.stats).clone()
    }

    /// Forgets the stats and faults, and reads the repositories again (for files a test
    /// changed).
    pub fn reset(&self) -> std::io::Result<()> {
        let repos = repo::scan_root(&self.state.root)?;
        *self.state.repos.write().unwrap_or_else(|e| e.into_inner()) = repos;
        *lock(&self.state.stats) = Stats::default();
        let retry_after = lock(&self.state.faults).retry_after;
        *lock(&self.state.faults) = FaultState {
            retry_after,
            ..FaultState::default()
        };
        Ok(())
    }

    /// The commit `repo` is served at.
    pub fn commit(&self, repo: &str) -> Option<String> {
        self.state.repo(repo).map(|r| r.commit)
    }

    /// The repository as served.
    pub fn repo(&self, repo: &str) -> Option<Repo> {
        self.state.repo(repo)
    }
}

impl Drop for TestHub {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Breaks the hub for the requests that follow.
#[derive(Debug, Clone, Copy)]
pub struct Faults<'a>(&'a State);

impl Faults<'_> {
    /// The next `count` requests of `kind` are answered `status` (with `Retry-After` when
    /// one is set and the status is 429 or 503).
    pub fn fail_next(self, kind: Kind, count: u32, status: u16) {
        lock(&self.0.faults).fail.insert(kind, (count, status));
    }

    /// The next `count` CDN bodies drop their connection after `bytes` bytes.
    pub fn cut_next(self, count: u32, bytes: u64) {
        lock(&self.0.faults).cut = Some((count, bytes));
    }

    /// The next `count` CDN bodies have their first byte flipped.
    pub fn corrupt_next(self, count: u32) {
        lock(&self.0.faults).corrupt = count;
    }

    /// Every signed CDN URL handed out so far stops working (403), as they do when they
    /// expire during a long download.
    pub fn expire_urls(self) {
        self.0.secret.fetch_add(1, Ordering::SeqCst);
    }

    /// Sets or clears the `Retry-After` seconds on injected 429 and 503 answers.
    pub fn set_retry_after(self, secs: Option<u64>) {
        lock(&self.0.faults).retry_after = secs;
    }

    /// Holds each CDN body to `bytes_per_sec` (0: no limit), as a CDN does per connection.
    pub fn set_stream_rate(self, bytes_per_sec: u64) {
        self.0.stream_rate.store(bytes_per_sec, Ordering::Relaxed);
    }

    /// Removes every pending fault.
    pub fn clear(self) {
        let mut f = lock(&self.0.faults);
        f.fail.clear();
        f.cut = None;
        f.corrupt = 0;
        self.0.stream_rate.store(0, Ordering::Relaxed);
    }
}
