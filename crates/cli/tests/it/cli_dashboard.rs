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
use crate::cli_serve::test_cache_dir;

const PLAYWRIGHT: &str = "playwright==1.65.2";
const MODEL: &str = "smollm2-135m-instruct";

/// The system's Chromium, installed with apt if it is missing (the test runs as root).
fn chromium() -> PathBuf {
    for p in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    let apt = |args: &[&str]| {
        Command::new("apt-get")
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
    let venv = test_cache_dir("test-venv-browser");
    let py = venv.join("bin/python");
    let ready = venv.join(format!(".installed-{PLAYWRIGHT}"));
    if !ready.exists() {
        let ok = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "creating the venv");
        let ok = Command::new(&py)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg(PLAYWRIGHT)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "installing playwright");
        std::fs::write(&ready, b"").expect("marker");
    }
    py
}

fn shots_dir() -> PathBuf {
    std::env::var_os("STRATA_SCREENSHOT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots"))
}

/// Runs the browser script in host 1's namespace at one viewport size; it kills host 2.
fn browse(net: &Net, label: &str, width: u32, height: u32) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/dashboard_browser.py");
    let out = Command::new("ip")
        .args(["netns", "exec", &net.ns(1)])
        .arg(python())
        .arg(script)
        .args(["--url", "http://127.0.0.1:8000/", "--chromium"])
        .arg(chromium())
        .arg("--shots")
        .arg(shots_dir())
        .args(["--label", label])
        .args([
            "--width",
            &width.to_string(),
            "--height",
            &height.to_string(),
        ])
        .args(["--nodes", "host1,host2", "--model", MODEL])
        .args([
            "--kill-pid",
            &net.pid(2).to_string(),
            "--kill-node",
            "host2",
        ])
        .env("PLAYWRIGHT_BROWSERS_PATH", "0")
        .output()
        .expect("running the browser script");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    if !out.status.success() {
        net.dump_logs();
        panic!("the dashboard failed in the browser ({label}):\n{text}");
    }
}

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
