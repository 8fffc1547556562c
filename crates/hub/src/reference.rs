//! `hf:` references: `OWNER/REPO[:QUANT][@REVISION]` and `OWNER/REPO/PATH.gguf[@REVISION]`.

use crate::pick::Pick;

/// The scheme a hub reference starts with.
pub const SCHEME: &str = "hf:";

/// A model on the hub, as a user names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubRef {
    /// `owner/name`.
    pub repo: String,
    /// Which GGUF of the repository.
    pub pick: Pick,
    /// A branch, tag or commit (`main` when not given).
    pub revision: String,
}

/// Repository names the hub accepts: letters, digits, `-`, `_` and `.`, not starting with a
/// dot or dash, at most 96 characters. Anything else could escape the cache's
/// `models--OWNER--NAME` folder or a URL path, so it is refused before either is built.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 96
        && !s.starts_with(['.', '-'])
        && !s.contains("--")
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A revision: a branch or tag name (which may hold `/`) or a commit, with no `..` and no
/// empty segment, since it becomes a path under the cache's `refs/`.
fn valid_revision(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
}

impl HubRef {
    /// Parses what follows `hf:`; the error says what was expected.
    pub fn parse(rest: &str) -> Result<HubRef, String> {
        let bad = || {
            format!(
                "expected hf:OWNER/REPO[:QUANT][@REVISION] or hf:OWNER/REPO/FILE.gguf[@REVISION], \
                 got hf:{rest}"
            )
        };
        let (body, revision) = match rest.rsplit_once('@') {
            Some((b, r)) => (b, r),
            None => (rest, "main"),
        };
        if !valid_revision(revision) {
            return Err(bad());
        }
        let mut it = body.splitn(3, '/');
        let (Some(owner), Some(second)) = (it.next(), it.next()) else {
            return Err(bad());
        };
        let (name, pick) = match it.next() {
            Some(file) => {
                let ok = crate::pick::is_gguf(file)
                    && file
                        .split('/')
                        .all(|s| !s.is_empty() && s != "." && s != "..")
                    && !file.contains(['\\', '?', '#', '%']);
                if !ok {
                    return Err(bad());
                }
                (second, Pick::File(file.to_string()))
            }
            None => match second.split_once(':') {
                Some((n, q)) if !q.is_empty() && valid_name(q) => {
                    (n, Pick::Quant(Some(q.to_string())))
                }
                Some(_) => return Err(bad()),
                None => (second, Pick::Quant(None)),
            },
        };
        if !valid_name(owner) || !valid_name(name) {
            return Err(bad());
        }
        Ok(HubRef {
            repo: format!("{owner}/{name}"),
            pick,
            revision: revision.to_string(),
        })
    }

    /// The reference written back as an id (`hf:owner/repo:Q4_K_M`, `@rev` only when not
    /// `main`).
    pub fn id(&self) -> String {
        let rev = if self.revision == "main" {
            String::new()
        } else {
            format!("@{}", self.revision)
        };
        match &self.pick {
            Pick::Quant(Some(q)) => format!("{SCHEME}{}:{q}{rev}", self.repo),
            Pick::Quant(None) => format!("{SCHEME}{}{rev}", self.repo),
            Pick::File(f) => format!("{SCHEME}{}/{f}{rev}", self.repo),
        }
    }

    /// `owner/repo@revision`, for messages.
    pub fn what(&self) -> String {
        format!("{}@{}", self.repo, self.revision)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_form_parses_and_writes_back() {
        let r = HubRef::parse("Qwen/Qwen3-8B-GGUF:Q4_K_M").unwrap();
        assert_eq!(r.repo, "Qwen/Qwen3-8B-GGUF");
        assert_eq!(r.pick, Pick::Quant(Some("Q4_K_M".into())));
        assert_eq!(r.revision, "main");
        assert_eq!(r.id(), "hf:Qwen/Qwen3-8B-GGUF:Q4_K_M");
        let r = HubRef::parse("o/r/sub/x-00001-of-00002.gguf@v1.0").unwrap();
        assert_eq!(r.pick, Pick::File("sub/x-00001-of-00002.gguf".into()));
        assert_eq!(r.revision, "v1.0");
        assert_eq!(r.id(), "hf:o/r/sub/x-00001-of-00002.gguf@v1.0");
        assert_eq!(HubRef::parse("o/r").unwrap().pick, Pick::Quant(None));
    }

    #[test]
    fn names_that_could_leave_the_cache_or_the_url_are_refused() {
        for bad in [
            "o",
            "o/",
            "../r",
            "o/..",
            "o/r:",
            "o/r@",
            "o/r@../x",
            "o/r/../x.gguf",
            "o/r/x.bin",
            "o--x/r",
            "o/r:Q4/../",
            "o/r/a%2f.gguf",
            ".o/r",
        ] {
            assert!(HubRef::parse(bad).is_err(), "{bad}");
        }
    }
}
