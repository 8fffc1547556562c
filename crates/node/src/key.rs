//! The cluster key: one 256-bit secret shared by every node of a cluster, and everything derived
//! from it.
//!
//! A node proves membership by holding the key, never by sending it:
//! - the control plane (zenoh) runs over mutual TLS whose certificate authority is an Ed25519 key
//!   derived from the secret, so every key holder can mint a node certificate the others accept,
//!   and a process without the key can neither complete a handshake nor read a byte;
//! - the data plane between ranks authenticates both ends with an HMAC challenge over the secret
//!   (see `strata_net`), before any activation is parsed;
//! - the topic prefix carries a fingerprint of the key, so two clusters on one LAN never mix.

use std::io::Write;
use std::net::IpAddr;
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// First word of a key file; a later format gets a new word.
const HEADER: &str = "strata-cluster-key-v1";

/// A cluster secret.
#[derive(Clone)]
pub struct ClusterKey {
    secret: [u8; 32],
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret itself.
        write!(f, "ClusterKey({})", self.fingerprint())
    }
}

impl ClusterKey {
    /// A fresh random key.
    pub fn generate() -> ClusterKey {
        ClusterKey {
            secret: rand::random(),
        }
    }

    /// A key from raw bytes (tests and the data plane).
    pub fn from_secret(secret: [u8; 32]) -> ClusterKey {
        ClusterKey { secret }
    }

    /// Parses the text of a key file.
    pub fn parse(text: &str) -> Result<ClusterKey> {
        let mut words = text.split_whitespace();
        if words.next() != Some(HEADER) {
            return Err(Error::BadKey(format!("it does not start with {HEADER:?}")));
        }
        let hex = words
            .next()
            .ok_or_else(|| Error::BadKey("the secret is missing".into()))?;
        if words.next().is_some() {
            return Err(Error::BadKey("unexpected text after the secret".into()));
        }
        let bytes = decode_hex(hex)
            .filter(|b| b.len() == 32)
            .ok_or_else(|| Error::BadKey("the secret is not 64 hex digits".into()))?;
        let mut secret = [0u8; 32];
        secret.copy_from_slice(&bytes);
        Ok(ClusterKey { secret })
    }

    /// Reads a key file.
    pub fn load(path: &Path) -> Result<ClusterKey> {
        strata_http::auth::check_private(path, "the cluster key file").map_err(Error::BadKey)?;
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        ClusterKey::parse(&text).map_err(|e| match e {
            Error::BadKey(why) => Error::BadKey(format!("{}: {why}", path.display())),
            other => other,
        })
    }

    /// Writes the key to `path`, readable by its owner only; refuses to overwrite.
    pub fn save(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        }
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(path).map_err(|e| Error::io(path, e))?;
        writeln!(f, "{HEADER} {}", encode_hex(&self.secret)).map_err(|e| Error::io(path, e))?;
        Ok(())
    }

    /// Loads the key at `path`, or creates it there if there is none yet; says which.
    pub fn load_or_create(path: &Path) -> Result<(ClusterKey, bool)> {
        if path.exists() {
            return Ok((ClusterKey::load(path)?, false));
        }
        let key = ClusterKey::generate();
        key.save(path)?;
        Ok((key, true))
    }

    /// A short public name of the key (16 hex digits): safe to show and to put in topics.
    pub fn fingerprint(&self) -> String {
        let d = Sha256::new()
            .chain_update(b"strata fingerprint")
            .chain_update(self.secret)
            .finalize();
        encode_hex(&d[..8])
    }

    /// HMAC-SHA-256 of `parts` under a sub-key for `purpose`.
    pub fn mac(&self, purpose: &str, parts: &[&[u8]]) -> [u8; 32] {
        let sub = self.derive(purpose);
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&sub).expect("HMAC takes any key length");
        for p in parts {
            m.update(p);
        }
        m.finalize().into_bytes().into()
    }

    /// A 32-byte sub-key for `purpose`, independent of every other purpose's.
    pub fn derive(&self, purpose: &str) -> [u8; 32] {
        let mut m =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.secret).expect("HMAC takes any key length");
        m.update(b"strata derive ");
        m.update(purpose.as_bytes());
        m.finalize().into_bytes().into()
    }

    /// The cluster's certificate authority and a fresh certificate for this node, valid for the
    /// names and addresses in `names` (the TLS dialer checks the address it dialled).
    pub fn tls_identity(&self, names: &[String]) -> Result<TlsIdentity> {
        let ca_key = self.ca_key()?;
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(tls)?;
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        ca.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("strata cluster {}", self.fingerprint()),
        );
        ca.not_before = rcgen::date_time_ymd(2024, 1, 1);
        ca.not_after = rcgen::date_time_ymd(2124, 1, 1);
        ca.serial_number = Some(rcgen::SerialNumber::from_slice(&[1]));
        ca.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).map_err(tls)?;
        let issuer = rcgen::Issuer::new(ca, ca_key);

        let leaf_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).map_err(tls)?;
        let mut leaf = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(tls)?;
        for n in names {
            let san = match n.parse::<IpAddr>() {
                Ok(ip) => rcgen::SanType::IpAddress(ip),
                Err(_) => rcgen::SanType::DnsName(n.clone().try_into().map_err(tls)?),
            };
            if !leaf.subject_alt_names.contains(&san) {
                leaf.subject_alt_names.push(san);
            }
        }
        leaf.distinguished_name
            .push(rcgen::DnType::CommonName, "strata node");
        leaf.not_before = rcgen::date_time_ymd(2024, 1, 1);
        leaf.not_after = rcgen::date_time_ymd(2124, 1, 1);
        leaf.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let leaf_cert = leaf.signed_by(&leaf_key, &issuer).map_err(tls)?;
        Ok(TlsIdentity {
            ca_pem: ca_cert.pem(),
            cert_pem: leaf_cert.pem(),
            key_pem: leaf_key.serialize_pem(),
        })
    }

    /// The CA's Ed25519 key: the same on every node, because it comes from the secret.
    fn ca_key(&self) -> Result<rcgen::KeyPair> {
        // PKCS#8 v1 wrapping of a raw Ed25519 seed (RFC 8410): a fixed prefix, then the seed.
        const PREFIX: [u8; 16] = [
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        let mut der = PREFIX.to_vec();
        der.extend_from_slice(&self.derive("tls ca ed25519 seed"));
        rcgen::KeyPair::try_from(der.as_slice()).map_err(tls)
    }
}

fn tls(e: rcgen::Error) -> Error {
    Error::Tls(e.to_string())
}

/// PEM texts for the control plane's mutual TLS.
#[derive(Clone)]
pub struct TlsIdentity {
    /// The cluster CA certificate.
    pub ca_pem: String,
    /// This node's certificate, signed by the CA.
    pub cert_pem: String,
    /// This node's private key.
    pub key_pem: String,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsIdentity(..)")
    }
}

/// Lower-case hex.
pub fn encode_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_key_loads_back_and_is_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/cluster.key");
        let key = ClusterKey::generate();
        key.save(&path).expect("save");
        let back = ClusterKey::load(&path).expect("load");
        assert_eq!(back.secret, key.secret);
        assert!(
            key.save(&path).is_err(),
            "an existing key is never overwritten"
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let (again, created) = ClusterKey::load_or_create(&path).expect("load_or_create");
        assert!(!created);
        assert_eq!(again.fingerprint(), key.fingerprint());
        // Opened to the group or the world, it is refused with the fix.
        #[cfg(unix)]
        for mode in [0o644, 0o640, 0o602] {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let e = ClusterKey::load(&path)
                .expect_err("an exposed key")
                .to_string();
            assert!(
                e.contains("chmod 600") && e.contains(&format!("{mode:04o}")),
                "{e}"
            );
        }
    }

    #[test]
    fn malformed_key_files_are_refused_with_a_reason() {
        for (text, why) in [
            ("", "does not start"),
            ("strata-cluster-key-v1", "missing"),
            ("strata-cluster-key-v1 abcd", "64 hex"),
            (
                &format!("strata-cluster-key-v1 {}", "zz".repeat(32)),
                "64 hex",
            ),
            (
                &format!("strata-cluster-key-v1 {} extra", "00".repeat(32)),
                "unexpected",
            ),
        ] {
            let err = ClusterKey::parse(text).expect_err(text).to_string();
            assert!(err.contains(why), "{text:?}: {err}");
        }
        assert!(ClusterKey::parse(&format!("strata-cluster-key-v1 {}\n", "ab".repeat(32))).is_ok());
    }

    #[test]
    fn derived_values_depend_on_the_secret_and_the_purpose() {
        let a = ClusterKey::from_secret([1; 32]);
        let b = ClusterKey::from_secret([2; 32]);
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.derive("x"), a.derive("y"));
        assert_eq!(a.mac("p", &[b"ab", b"c"]), a.mac("p", &[b"a", b"bc"]));
        assert_ne!(a.mac("p", &[b"abc"]), b.mac("p", &[b"abc"]));
        assert!(
            !format!("{a:?}").contains("0101"),
            "Debug never shows the secret"
        );
    }

    #[test]
    fn every_node_derives_the_same_authority() {
        let key = ClusterKey::from_secret([7; 32]);
        let one = key
            .tls_identity(&["10.0.0.1".into(), "node-a".into()])
            .expect("tls");
        let two = key.tls_identity(&["10.0.0.2".into()]).expect("tls");
        assert_eq!(one.ca_pem, two.ca_pem, "the CA is a function of the secret");
        assert_ne!(one.key_pem, two.key_pem, "node keys are fresh");
        let other = ClusterKey::from_secret([8; 32])
            .tls_identity(&["10.0.0.1".into()])
            .expect("tls");
        assert_ne!(one.ca_pem, other.ca_pem);
    }
}
