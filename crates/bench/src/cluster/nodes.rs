//! The nodes a run starts on this machine: ports, the emulated link between them, and
//! what each CPU is.

use super::*;

/// Node processes of one configuration; killed when dropped.
pub(super) struct Nodes {
    pub(super) children: Vec<Child>,
    pub(super) urls: Vec<String>,
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub(super) fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The CPU's name as the kernel reports it (figures are meaningless without it).
#[cfg(not(target_os = "macos"))]
pub(super) fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The CPU's name as the kernel reports it (figures are meaningless without it): sysctl
/// `machdep.cpu.brand_string` (`Apple M2 Pro`, or an Intel model name).
#[cfg(target_os = "macos")]
pub(super) fn cpu_name() -> String {
    strata_node::host::sysctl_string("machdep.cpu.brand_string")
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// What a link preset asks the nodes to emulate.
pub(super) struct LinkSetting {
    pub(super) id: String,
    /// The nodes' `--transport`.
    pub(super) transport: &'static str,
    pub(super) latency: Duration,
    pub(super) bandwidth: Option<f64>,
}

pub(super) fn link_setting(id: &str, transport: &str) -> Result<LinkSetting> {
    let forced = match transport {
        "tcp" => Some("tcp"),
        "shm" => Some("shm"),
        _ => None,
    };
    if id == "none" {
        return Ok(LinkSetting {
            id: id.into(),
            transport: forced.unwrap_or("tcp"),
            latency: Duration::ZERO,
            bandwidth: None,
        });
    }
    let p = strata_cluster::hardware::presets().link(id)?;
    if p.measured.is_some() {
        bail!("link {id} is measured, not emulated: use `none` for loopback as it is");
    }
    Ok(LinkSetting {
        id: id.into(),
        transport: forced.unwrap_or(if p.rdma { "shm" } else { "tcp" }),
        latency: Duration::from_secs_f64(p.latency_us * 1e-6),
        bandwidth: (p.bandwidth_gbit > 0.0).then_some(p.bandwidth_gbit * 1e9 / 8.0),
    })
}

/// Starts `n` nodes that know each other, and waits until each has measured its links.
pub(super) fn start_nodes(
    dir: &Path,
    n: usize,
    threads: usize,
    link: &LinkSetting,
    model_dir: Option<&Path>,
) -> Result<Nodes> {
    let exe = crate::strata_exe()?;
    let key = dir.join("cluster.key");
    let mut nodes = Nodes {
        children: Vec::new(),
        urls: Vec::new(),
    };
    let mut first_control = None;
    for i in 0..n {
        let (api, control) = (free_port()?, free_port()?);
        let log = std::fs::File::create(dir.join(format!("node{i}.log")))?;
        let mut cmd = Command::new(&exe);
        // Unsupervised: a node that dies is a failed run here, not one to bring back.
        cmd.arg("node")
            .args([
                "--name",
                &format!("bench{i}"),
                "--no-multicast",
                "--no-supervise",
            ])
            .args(["--threads", &threads.to_string()])
            .args(["--transport", link.transport])
            .args(["--api-addr", &format!("127.0.0.1:{api}")])
            .args(["--control-addr", &format!("127.0.0.1:{control}")])
            .args(["--advertise-addr", "127.0.0.1"])
            .arg("--state-dir")
            .arg(dir.join(format!("state{i}")))
            .arg("--cluster-key-file")
            .arg(&key);
        if let Some(c) = first_control {
            cmd.args(["--peer", &format!("127.0.0.1:{c}")]);
        }
        if !link.latency.is_zero() {
            cmd.args([
                "--emulate-link-latency",
                &format!("{}ns", link.latency.as_nanos()),
            ]);
        }
        if let Some(bw) = link.bandwidth {
            cmd.args(["--emulate-link-bandwidth", &format!("{bw}B/s")]);
        }
        if let Some(d) = model_dir {
            cmd.arg("--allow-model-dir").arg(d);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        strata_node::process::die_with_parent(&mut cmd);
        nodes.children.push(cmd.spawn().context("starting a node")?);
        let url = format!("http://127.0.0.1:{api}");
        wait_http(&url, Duration::from_secs(120))
            .with_context(|| format!("node {i} (log: {})", dir.display()))?;
        nodes.urls.push(url);
        first_control.get_or_insert(control);
    }
    // Every node must see the others and have measured its links (with the emulated latency)
    // before the planner can be asked anything.
    let node = NodeAddr::at(&nodes.urls[0]);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s: Status = node.call("GET", "/v1/cluster/status", None)?;
        let measured = s.topology.nodes.len() == n
            && s.topology.links.len() == n * (n - 1) / 2
            && s.topology
                .links
                .iter()
                .all(|l| l.latency >= link.latency.as_secs_f64());
        if measured {
            return Ok(nodes);
        }
        if Instant::now() > deadline {
            bail!(
                "the {n} nodes did not all see each other's measured links within 120 s (logs: {})",
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

pub(super) fn wait_http(url: &str, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .into();
    while agent.get(&format!("{url}/health")).call().is_err() {
        if Instant::now() > deadline {
            bail!("{url} did not answer within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// CPU seconds (user and system) this process's threads have used.
pub(super) fn own_cpu() -> f64 {
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// CPU seconds (user and system) the processes `pids` and their descendants (the nodes'
/// rank workers) have used, from `/proc` (`None` where it cannot be read).
#[cfg(not(target_os = "macos"))]
pub(super) fn cpu_of(pids: &[u32]) -> Option<f64> {
    // SAFETY: sysconf reads a configuration value.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    if tick <= 0.0 {
        return None;
    }
    // Every process as (pid, parent, CPU ticks).
    let mut procs: Vec<(u32, u32, f64)> = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Fields after the command name (which may hold spaces, so it is skipped by its
        // closing parenthesis): the parent is the 2nd, utime and stime the 12th and 13th.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok());
        if let (Some(parent), Some(u), Some(s)) = (num(1), num(11), num(12)) {
            procs.push((pid, parent as u32, u + s));
        }
    }
    let mut mine: Vec<u32> = pids.to_vec();
    if !pids.iter().all(|p| procs.iter().any(|q| q.0 == *p)) {
        return None;
    }
    // Descendants, a generation at a time.
    loop {
        let before = mine.len();
        for &(pid, parent, _) in &procs {
            if mine.contains(&parent) && !mine.contains(&pid) {
                mine.push(pid);
            }
        }
        if mine.len() == before {
            break;
        }
    }
    let ticks: f64 = procs
        .iter()
        .filter(|p| mine.contains(&p.0))
        .map(|p| p.2)
        .sum();
    Some(ticks / tick)
}

/// CPU seconds (user and system) the processes `pids` and their descendants (the nodes'
/// rank workers) have used, from the kernel's per-process usage (`proc_pid_rusage`), the
/// descendants found a generation at a time (`None` where a process of `pids` is gone).
#[cfg(target_os = "macos")]
pub(super) fn cpu_of(pids: &[u32]) -> Option<f64> {
    let mut total = 0.0;
    let mut generation = pids.to_vec();
    let mut seen: Vec<u32> = Vec::new();
    let mut first = true;
    while !generation.is_empty() {
        let mut next = Vec::new();
        for pid in generation {
            if seen.contains(&pid) {
                continue;
            }
            seen.push(pid);
            match strata_node::host::cpu_seconds(pid) {
                Some(s) => total += s,
                None if first => return None,
                // A worker that ended between the listing and now took its time with it.
                None => continue,
            }
            next.extend(strata_node::host::children(pid));
        }
        generation = next;
        first = false;
    }
    Some(total)
}
