//! The CLI's end-to-end tests, one module per command or scenario, in one test binary: each
//! binary links the whole dependency graph, so one instead of eight saves most of the build.

mod cli_access;
mod cli_agents;
// Hosts as Linux network namespaces (ip netns, setns): nothing to stand for them on macOS.
#[cfg(target_os = "linux")]
mod cli_cluster;
#[cfg(target_os = "linux")]
mod cli_dashboard;
mod cli_hardening;
#[cfg(target_os = "linux")]
mod cli_hub_cluster;
mod cli_models_hub;
mod cli_models_import;
mod cli_plan;
mod cli_run;
mod cli_serve;
mod cli_sharded;
mod dependency_licences;
