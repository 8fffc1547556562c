//! The HTTP surface every strata server shares: `strata serve`'s API and a cluster node's
//! API and admin routes are both served through it, so both get the same connection limits,
//! browser checks, key handling and error shapes.
//!
//! - [`access`]: the access log, one line per request, and the observers that count requests.
//! - [`listen`]: the connection server (deadlines, a connection cap, graceful shutdown).
//! - [`browser`]: the checks of every route against browsers (Host, Origin, JSON bodies, CORS).
//! - [`auth`]: API keys (constant-time check), per-key token buckets, and the [`auth::Tenant`]
//!   a checked key names.
//! - [`ApiError`] and [`Dialect`]: every failure as the JSON error object of the API that was
//!   asked (OpenAI's, Anthropic's or Ollama's shape).
//! - [`dashboard`]: the web UI (plain JavaScript modules embedded in the binary).
#![warn(missing_docs)]

pub mod access;
pub mod auth;
pub mod browser;
pub mod dashboard;
mod error;
pub mod listen;

pub use error::{ApiError, Dialect, in_dialect};
