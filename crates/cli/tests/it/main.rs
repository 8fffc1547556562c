//! The CLI's end-to-end tests, one module per command or scenario, in one test binary: each
//! binary links the whole dependency graph, so one instead of eight saves most of the build.

mod cli_cluster;
mod cli_dashboard;
mod cli_hardening;
mod cli_hub_cluster;
mod cli_models_hub;
mod cli_models_import;
mod cli_plan;
mod cli_run;
mod cli_serve;
mod cli_sharded;
mod dependency_licences;
