//! Two processes that claim one node id: a state directory copied between machines, or shared
//! by two nodes started with one `--state-dir`. Each state a node publishes carries who sent it
//! (a [`Claimant`]: its zenoh session and when its control plane started); the process that
//! held the id first keeps it everywhere, the other's states are ignored and warned about once,
//! and the other, when it sees the first, is told to stop ([`super::Control::displaced_by`]).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{NodeState, View};

/// How long a member's state may go unrefreshed before another process may take over its id
/// (a node restarted before its old session's lease ran out): three missed publications.
const SILENT_AFTER: Duration = Duration::from_secs(3);

/// Which process published a state: its zenoh session and when its control plane started. It
/// travels beside each state (as the sample's attachment), so two processes that claim one node
/// id (a state directory copied between machines, or shared by two nodes) are told apart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Claimant {
    pub(super) session: String,
    pub(super) started_ms: u64,
}

impl Claimant {
    /// Whether this process holds the id before `other`: the one that started first (by the
    /// session id when both started in the same millisecond), so every member agrees.
    fn precedes(&self, other: &Claimant) -> bool {
        (self.started_ms, &self.session) < (other.started_ms, &other.session)
    }
}

/// What to do with a state published under a member's id.
#[derive(Debug, PartialEq, Eq)]
enum Claim {
    /// The member's own state (or one from a node too old to say who sent it): take it.
    Take,
    /// Another process claims the id and held it first: take the state, and warn.
    Replace,
    /// Another process claims an id a live member held first: ignore its state, and warn.
    Ignore,
    /// Another process holds this node's own id and held it first: this node must stop.
    Yield,
}

/// Decides about a state under member `id` from `incoming`, where `mine` is this process,
/// `is_me` whether `id` is this node's, and `held` who published the state taken for the member
/// so far and how long ago it last arrived.
fn judge(
    mine: &Claimant,
    is_me: bool,
    held: Option<(&Claimant, Duration)>,
    incoming: Option<&Claimant>,
) -> Claim {
    let Some(incoming) = incoming else {
        return Claim::Take;
    };
    if is_me {
        return if incoming == mine {
            Claim::Take
        } else if incoming.precedes(mine) {
            Claim::Yield
        } else {
            Claim::Ignore
        };
    }
    match held {
        None => Claim::Take,
        Some((held, _)) if held == incoming => Claim::Take,
        Some((_, quiet)) if quiet >= SILENT_AFTER => Claim::Take,
        Some((held, _)) if incoming.precedes(held) => Claim::Replace,
        Some(_) => Claim::Ignore,
    }
}

/// A node as a warning names it: its name, host and API address.
fn described(state: &NodeState) -> String {
    let p = &state.profile;
    format!("{} (host {}, API {})", p.name, p.hostname, p.api_addr)
}

/// Takes `state` into the view as member `id`'s, or refuses it when another process holds the
/// id (see [`judge`]); whether the view changed. A second claimant is warned about once.
pub(super) fn take_state(
    v: &mut View,
    mine: &Claimant,
    is_me: bool,
    state: NodeState,
    from: Option<Claimant>,
) -> bool {
    let id = state.profile.id.clone();
    // Only live members: a state that outlives its token is stale.
    let Some(m) = v.members.get(&id) else {
        return false;
    };
    let held = m.claimant.as_ref().map(|(c, at)| (c.clone(), at.elapsed()));
    let holder = m.state.as_ref().map_or_else(|| id.clone(), described);
    let verdict = judge(
        mine,
        is_me,
        held.as_ref().map(|(c, q)| (c, *q)),
        from.as_ref(),
    );
    match verdict {
        Claim::Take | Claim::Replace => {
            if verdict == Claim::Replace
                && let Some((held, _)) = &held
                && v.warned.insert((id.clone(), held.session.clone()))
            {
                warn_twice(v, &id, &described(&state), &holder);
            }
            if let Some(m) = v.members.get_mut(&id) {
                m.claimant = from.map(|c| (c, Instant::now()));
                m.state = Some(state);
            }
            true
        }
        Claim::Ignore => {
            if let Some(c) = &from
                && v.warned.insert((id.clone(), c.session.clone()))
            {
                warn_twice(v, &id, &holder, &described(&state));
            }
            false
        }
        Claim::Yield => {
            if v.displaced_by.is_none() {
                let other = described(&state);
                v.event(format!(
                    "{holder} (this node) has the node id {id} of {other}, which started first"
                ));
                v.displaced_by = Some(other);
            }
            true
        }
    }
}

/// Records (as a warning, which the node logs) that two live processes claim node id `id`: `kept`, which held it first,
/// and `ignored`, whose states the cluster does not take.
fn warn_twice(v: &mut View, id: &str, kept: &str, ignored: &str) {
    let what = format!(
        "two nodes claim the node id {id}: {kept} and {ignored}; the cluster keeps the one that \
         started first and ignores {ignored} (a state directory copied between machines, or \
         shared by two nodes)"
    );
    v.record(what, true);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::{Event, Member};
    use super::*;
    use crate::profile::Profile;

    fn claimant(session: &str, started_ms: u64) -> Claimant {
        Claimant {
            session: session.into(),
            started_ms,
        }
    }

    fn state(id: &str, name: &str) -> NodeState {
        let mut profile: Profile = serde_json::from_value(serde_json::json!({
            "id": id, "name": name, "hostname": format!("{name}-host"), "version": "test",
            "memory_total": 1, "memory_available": 1, "cores": 1, "backend": "cpu",
            "matmul_gflops": 1.0, "mem_bandwidth": 1.0, "api_addr": format!("{name}:8000"),
            "started_at": 0,
        }))
        .unwrap();
        profile.id = id.into();
        NodeState {
            profile,
            links: Vec::new(),
            draining: false,
            extra: serde_json::Value::Null,
        }
    }

    fn view_with(ids: &[&str]) -> View {
        let mut v = View::default();
        for id in ids {
            v.members.insert((*id).into(), Member::default());
        }
        v
    }

    #[test]
    fn the_process_that_held_an_id_first_keeps_it() {
        let (me, older, newer) = (claimant("b", 200), claimant("a", 100), claimant("c", 300));
        let now = Duration::ZERO;
        // Someone else's id: the first claimant stays, a later one is ignored, an earlier one
        // (seen second) takes over, and a holder silent for a while gives way to a restart.
        assert_eq!(judge(&me, false, None, Some(&newer)), Claim::Take);
        assert_eq!(
            judge(&me, false, Some((&older, now)), Some(&older)),
            Claim::Take
        );
        assert_eq!(
            judge(&me, false, Some((&older, now)), Some(&newer)),
            Claim::Ignore
        );
        assert_eq!(
            judge(&me, false, Some((&newer, now)), Some(&older)),
            Claim::Replace
        );
        assert_eq!(
            judge(&me, false, Some((&older, SILENT_AFTER)), Some(&newer)),
            Claim::Take
        );
        // This node's own id: its own echo is taken; an older holder sends it away; a newer one
        // is ignored (it will go itself).
        assert_eq!(judge(&me, true, None, Some(&me)), Claim::Take);
        assert_eq!(judge(&me, true, None, Some(&older)), Claim::Yield);
        assert_eq!(judge(&me, true, None, Some(&newer)), Claim::Ignore);
        // A node too old to say who it is: taken as before.
        assert_eq!(judge(&me, false, Some((&older, now)), None), Claim::Take);
        // Same millisecond: the session decides, the same way everywhere.
        assert!(claimant("a", 5).precedes(&claimant("b", 5)));
        assert!(!claimant("b", 5).precedes(&claimant("a", 5)));
    }

    #[test]
    fn a_second_node_with_a_live_members_id_does_not_replace_its_profile() {
        // Once, the last state to arrive under an id replaced the member's profile, so two
        // nodes with one state directory took turns being the member.
        let me = claimant("me", 50);
        let mut v = view_with(&["dup", "mine"]);
        let (first, second) = (claimant("s1", 100), claimant("s2", 200));
        assert!(take_state(
            &mut v,
            &me,
            false,
            state("dup", "alpha"),
            Some(first.clone())
        ));
        for _ in 0..3 {
            assert!(!take_state(
                &mut v,
                &me,
                false,
                state("dup", "beta"),
                Some(second.clone())
            ));
        }
        assert_eq!(
            v.members["dup"].state.as_ref().unwrap().profile.name,
            "alpha"
        );
        let warnings: Vec<&Event> = v
            .events
            .iter()
            .filter(|e| e.what.contains("two nodes"))
            .collect();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        let w = &warnings[0].what;
        assert!(w.contains("alpha (host alpha-host, API alpha:8000)"), "{w}");
        assert!(w.contains("beta (host beta-host, API beta:8000)"), "{w}");
        // The holder's own states keep coming in.
        assert!(take_state(
            &mut v,
            &me,
            false,
            state("dup", "alpha"),
            Some(first)
        ));
        assert!(v.displaced_by.is_none());

        // This node's own id, held first by another: it is told to go, and names who.
        take_state(&mut v, &me, true, state("mine", "me"), Some(me.clone()));
        assert!(take_state(
            &mut v,
            &me,
            true,
            state("mine", "other"),
            Some(claimant("o", 10))
        ));
        assert_eq!(
            v.displaced_by.as_deref(),
            Some("other (host other-host, API other:8000)")
        );
        assert_eq!(v.members["mine"].state.as_ref().unwrap().profile.name, "me");
    }
}
