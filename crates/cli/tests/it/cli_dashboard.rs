//! The dashboard in a real browser: headless Chromium (Debian's `chromium`, driven by
//! Playwright's Python package) against a two-node cluster in network namespaces, at desktop
//! and at phone width. The browser runs inside the first node's namespace and talks to its node
//! as a user on that machine would; `crates/cli/tests/py/dashboard_browser.py` says what is
//! checked. Screenshots of every view are kept (CI artefacts) under `$STRATA_SCREENSHOT_DIR`, by
//! default the test target directory's `dashboard-screenshots`.
//!
//! Needs root (namespaces, and `apt-get install chromium` where it is missing), so it is ignored
//! unless asked for, as the other cluster tests are.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::cli_cluster::{Net, names};
use crate::cli_serve::venv_python;

const PLAYWRIGHT: &str = "playwright==1.65.2";
const MODEL: &str = "smollm2-135m-instruct";

/// The system's Chromium, installed with apt if it is missing (the test runs as root).
/// The tests run in parallel: one installs while the others wait (two apt-gets at once fail on
/// dpkg's lock), then finds it installed.
fn chromium() -> PathBuf {
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = INSTALL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for p in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            // Another process's apt (the machine's own) may hold the lock for a while.
            .args(["-o", "DPkg::Lock::Timeout=300"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    assert!(
        apt(&["update", "-qq"]) && apt(&["install", "-y", "-qq", "chromium"]),
        "installing chromium with apt-get failed"
    );
    PathBuf::from("/usr/bin/chromium")
}

/// A Python with Playwright (its own browser download is never used: the system's Chromium is).
fn python() -> PathBuf {
    venv_python("test-venv-browser", &[PLAYWRIGHT])
}

fn shots_dir() -> PathBuf {
    std::env::var_os("STRATA_SCREENSHOT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots"))
}

/// Runs the browser script (inside `net`'s host 1 when given) with `args` after the common
/// ones; on failure, prints the nodes' logs and panics with the script's output.
fn script(net: Option<&Net>, url: &str, args: &[&str]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/dashboard_browser.py");
    let mut cmd = match net {
        Some(net) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &net.ns(1)]).arg(python());
            c
        }
        None => Command::new(python()),
    };
    let out = cmd
        .arg(path)
        .args(["--url", url, "--model", MODEL, "--chromium"])
        .arg(chromium())
        .arg("--shots")
        .arg(shots_dir())
        .args(args)
        .output()
        .expect("running the browser script");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    if !out.status.success() {
        if let Some(net) = net {
            net.dump_logs();
        }
        panic!("the dashboard failed in the browser ({args:?}):\n{text}");
    }
}

/// Runs the whole browser check in host 1's namespace at one viewport size; it kills host 2.
fn browse(net: &Net, label: &str, width: u32, height: u32) {
    let (w, h, pid) = (
        width.to_string(),
        height.to_string(),
        net.pid(2).to_string(),
    );
    let args = [
        "--label",
        label,
        "--width",
        &w,
        "--height",
        &h,
        "--nodes",
        "host1,host2",
    ];
    let kill = ["--kill-pid", &pid, "--kill-node", "host2"];
    script(Some(net), NODE_URL, &[&args[..], &kill[..]].concat());
}

/// A node's API address inside its namespace (the default `--api-addr`).
const NODE_URL: &str = "http://127.0.0.1:8000/";

#[test]
#[ignore = "needs root and iproute2 (network namespaces) and Chromium"]
fn the_dashboard_shows_the_cluster_loads_a_model_and_chats_in_a_real_browser() {
    let mut net = Net::new(2);
    let key = net.key("cluster.key");
    net.start(1, &key);
    for (label, width, height) in [("desktop", 1280, 800), ("phone", 390, 844)] {
        // Each pass starts with both nodes up: the previous one killed host 2.
        net.start(2, &key);
        net.wait_for("both nodes see each other", Duration::from_secs(30), || {
            (1..=2).all(|h| net.members(h) == names(&[1, 2]))
        });
        net.wait_for("the link is measured", Duration::from_secs(20), || {
            net.status(1)
                .is_some_and(|s| s["topology"]["links"].as_array().map_or(0, Vec::len) == 1)
        });
        browse(&net, label, width, height);
    }
    eprintln!("screenshots in {}", shots_dir().display());
}

#[test]
#[ignore = "needs root and iproute2 (network namespaces) and Chromium"]
fn the_dashboard_asks_for_a_key_and_offers_admin_actions_only_to_admin_keys() {
    let mut net = Net::new(1);
    let key = net.key("cluster.key");
    let keys = net.key("cluster.key").with_file_name("api-keys");
    std::fs::write(
        &keys,
        "sk-dash-admin-123456 name=ops role=admin\nsk-dash-client-12345 name=app\n",
    )
    .expect("key file");
    std::fs::set_permissions(&keys, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    net.start_args(1, &key, &["--api-key-file", keys.to_str().expect("path")]);
    net.wait_for("the node answers", Duration::from_secs(30), || {
        Command::new("ip")
            .args(["netns", "exec", &net.ns(1), "curl", "-s", "-m", "2"])
            .arg("http://127.0.0.1:8000/health")
            .output()
            .is_ok_and(|o| o.stdout == b"ok")
    });
    let args = ["--label", "keys", "--nodes", "host1"];
    let keys = [
        "--admin-key",
        "sk-dash-admin-123456",
        "--client-key",
        "sk-dash-client-12345",
    ];
    script(Some(&net), NODE_URL, &[&args[..], &keys[..]].concat());
}

#[test]
#[ignore = "needs Chromium (installed with apt-get as root where missing)"]
fn the_dashboard_chats_with_a_single_strata_serve() {
    let server = crate::cli_serve::serve(&[]);
    let url = format!("{}/", server.url);
    script(None, &url, &["--label", "serve", "--single"]);
}
