//! Whose cached prompt blocks a request may reuse.
//!
//! A prompt whose first blocks are cached answers its first token many times sooner, and the
//! answer's `cached_tokens` says how much was found: shared between clients, the prefix cache
//! would tell one what another sent. So each request runs in a prefix-cache partition
//! ([`strata_engine::prefix::Partition`]) named by who sent it, the [`Tenant`] (the API key's
//! name, set by whoever checked the key), and its `cache_salt` if it gives one (vLLM's field:
//! requests share blocks only with requests of the same salt). A server started with
//! `--shared-prefix-cache` (one tenant, or tenants that trust each other) puts every request of
//! the same salt in one partition, and requests without a salt in the shared one. A server
//! without keys has no tenants: only salts separate its requests.

use sha2::{Digest, Sha256};
use strata_engine::prefix::Partition;

use strata_http::ApiError;

pub use strata_http::auth::Tenant;

/// Longest `cache_salt` taken, in bytes.
pub(crate) const MAX_SALT: usize = 256;

/// Checks a request's `cache_salt`: a non-empty string of at most [`MAX_SALT`] bytes.
pub(crate) fn check_salt(salt: Option<&str>) -> Result<(), ApiError> {
    match salt {
        Some("") => Err(ApiError::invalid(
            "cache_salt",
            "cache_salt must not be empty; leave it out to use the default cache partition.",
        )),
        Some(s) if s.len() > MAX_SALT => Err(ApiError::invalid(
            "cache_salt",
            format!(
                "cache_salt is {} bytes; at most {MAX_SALT} are allowed.",
                s.len()
            ),
        )),
        _ => Ok(()),
    }
}

/// The partition of a request from `tenant` with `salt` (see the module docs); `shared` is
/// the server's `--shared-prefix-cache`. Names are hashed with SHA-256, so no tenant or salt
/// can be chosen to land in another's partition.
pub(crate) fn partition(shared: bool, tenant: Option<&Tenant>, salt: Option<&str>) -> Partition {
    let tenant = tenant.filter(|_| !shared);
    if tenant.is_none() && salt.is_none() {
        return Partition::SHARED;
    }
    let mut h = Sha256::new();
    h.update(b"strata prefix partition\0");
    for part in [tenant.map(|t| t.0.as_str()), salt] {
        match part {
            Some(p) => {
                h.update([1]);
                h.update((p.len() as u64).to_le_bytes());
                h.update(p.as_bytes());
            }
            None => h.update([0]),
        }
    }
    let d = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    Partition::from_digest(u64::from_le_bytes(first))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn keys_and_salts_name_partitions_and_the_shared_option_drops_keys_only() {
        let (a, b) = (Tenant("alice".into()), Tenant("bob".into()));
        let p = |shared, t, s| partition(shared, t, s);
        assert_eq!(p(false, None, None), Partition::SHARED);
        assert_ne!(p(false, Some(&a), None), Partition::SHARED);
        assert_ne!(p(false, Some(&a), None), p(false, Some(&b), None));
        assert_eq!(p(false, Some(&a), None), p(false, Some(&a), None));
        assert_ne!(p(false, Some(&a), Some("x")), p(false, Some(&a), Some("y")));
        assert_ne!(p(false, Some(&a), Some("x")), p(false, Some(&b), Some("x")));
        assert_ne!(p(false, None, Some("x")), Partition::SHARED);
        // One tenant's name and another's salt never meet.
        assert_ne!(p(false, Some(&a), None), p(false, None, Some("alice")));
        assert_eq!(p(true, Some(&a), None), Partition::SHARED);
        assert_eq!(p(true, Some(&a), Some("x")), p(true, Some(&b), Some("x")));
        assert!(check_salt(Some("")).is_err());
        assert!(check_salt(Some(&"s".repeat(MAX_SALT + 1))).is_err());
        assert!(check_salt(Some("team-1")).is_ok() && check_salt(None).is_ok());
    }
}
