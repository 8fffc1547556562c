//! Starting the ranks of a sharded instance: the command line of the worker processes rank 0
//! launches (`strata worker`, the same binary), and both halves of the handshake once the mesh
//! stands: rank 0 sends the [`Assignment`], every worker loads its shard and answers "ok" or
//! why not, so a shard that cannot load fails the instance with the worker's own reason.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use strata_gguf::GgufFile;
use strata_net::Communicator;

use crate::rank::{Assignment, Rank};
use crate::{Error, Result};

/// The environment variable a worker finds the session token in (never on the command line,
/// which other users of the host can read).
pub const TOKEN_ENV: &str = "STRATA_TOKEN";

/// What a worker answers rank 0 once its shard is loaded.
const READY: &[u8] = b"ok";

/// The command that starts rank `rank` of `world` as a worker process of `exe` joining rank 0
/// at `coordinator` (`model`: where this host keeps the model, when not where rank 0 does).
/// Standard input and output are closed, standard error inherited; the caller adds what ties
/// the child's life to its own.
pub fn worker_command(
    exe: &Path,
    coordinator: SocketAddr,
    (rank, world): (usize, usize),
    model: Option<&Path>,
    token: &str,
) -> Command {
    let mut cmd = Command::new(exe);
    cmd.args(["worker", "--coordinator", &coordinator.to_string()])
        .args(["--rank", &rank.to_string(), "--world", &world.to_string()]);
    if let Some(m) = model {
        cmd.arg("--model").arg(m);
    }
    cmd.env(TOKEN_ENV, token)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    cmd
}

impl Rank {
    /// Rank 0's half of the handshake: sends every worker the assignment, loads its own shard,
    /// and waits for every worker's answer (the workers' reasons joined when any failed).
    pub fn start_coordinator(
        mut comm: Communicator,
        file: &GgufFile,
        a: &Assignment,
    ) -> Result<Rank> {
        let json = serde_json::to_vec(a).map_err(|e| Error::Protocol(e.to_string()))?;
        for r in 1..comm.world() {
            comm.post_send(r, &[&json])?;
        }
        comm.wait()?;
        let world = comm.world();
        let shard = Rank::prepare(file, a, 0)?;
        let mut rank = Rank::new(comm, shard, &a.plan)?;
        let mut failed = Vec::new();
        for r in 1..world {
            let msg = rank.comm_mut().recv(r)?;
            if msg != READY {
                failed.push(format!("rank {r}: {}", String::from_utf8_lossy(msg)));
            }
        }
        if !failed.is_empty() {
            return Err(Error::Protocol(failed.join("; ")));
        }
        Ok(rank)
    }

    /// A worker's half: reads the assignment from rank 0, loads this rank's shard from the
    /// file `locate` names for it (the path rank 0 uses, unless this host keeps the model
    /// elsewhere), and tells rank 0 it is ready, or why it cannot be (then fails with that
    /// reason too).
    pub fn join_coordinator(
        mut comm: Communicator,
        locate: impl FnOnce(&Assignment) -> std::result::Result<PathBuf, String>,
    ) -> Result<Rank> {
        let me = comm.rank();
        let assignment: Assignment = serde_json::from_slice(comm.recv(0)?)
            .map_err(|e| Error::Protocol(format!("reading the shard plan from rank 0: {e}")))?;
        let loaded = locate(&assignment).and_then(|path| {
            let file = GgufFile::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            Rank::prepare(&file, &assignment, me).map_err(|e| e.to_string())
        });
        let shard = match loaded {
            Ok(s) => s,
            Err(message) => {
                // Rank 0 reports it with the others'; a send failing too changes nothing.
                let _ = comm.send(0, message.as_bytes());
                return Err(Error::Remote { rank: me, message });
            }
        };
        let mut rank = Rank::new(comm, shard, &assignment.plan)?;
        rank.comm_mut().send(0, READY)?;
        Ok(rank)
    }
}
