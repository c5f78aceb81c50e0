//! What a fake worker does with a function payload: a tiny command language, so tests
//! choose a behaviour by registering the matching payload.

use std::time::Duration;

/// The behaviour a payload spells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Behaviour {
    /// `echo`: return the arguments unchanged.
    Echo,
    /// `raise`: fail with a user error (`ValueError`).
    Raise,
    /// `infra`: fail with a worker-side infrastructure error.
    Infra,
    /// `sleep:<ms>`: wait, then echo.
    Sleep(Duration),
    /// `gate:<name>`: wait until the gate opens, then echo.
    Gate(String),
    /// `gate-raise:<name>`: wait until the gate opens, then raise.
    GateRaise(String),
    /// `crash-on:<worker>`: crash when run on that worker, else echo.
    CrashOn(usize),
    /// `crash`: crash whichever worker runs it; a supervisor starts that worker again at
    /// once (a closure that kills its workers, as a segfault would).
    Crash,
    /// `ps-fail:<task>:<times>`: the first `times` executions of each closure fail with a
    /// parameter-server failure naming ps task `task`; later ones echo.
    PsFail {
        /// The ps task the failure names.
        task: i64,
        /// How many executions of one closure fail.
        times: usize,
    },
    /// `resource`: as a resource, build successfully.
    Resource,
    /// `resource-raise`: as a resource, fail to build (user error).
    ResourceRaise,
    /// Anything else: fail with a user error naming the payload.
    Unknown(String),
}

impl Behaviour {
    /// Reads a payload.
    pub fn parse(payload: &[u8]) -> Self {
        let text = String::from_utf8_lossy(payload);
        let (verb, arg) = text.split_once(':').unwrap_or((&text, ""));
        match (verb, arg) {
            ("echo", _) => Self::Echo,
            ("raise", _) => Self::Raise,
            ("infra", _) => Self::Infra,
            ("crash", "") => Self::Crash,
            ("resource", _) => Self::Resource,
            ("resource-raise", _) => Self::ResourceRaise,
            ("sleep", ms) if ms.parse::<u64>().is_ok() => {
                Self::Sleep(Duration::from_millis(ms.parse().unwrap_or(0)))
            }
            ("gate", name) => Self::Gate(name.to_owned()),
            ("gate-raise", name) => Self::GateRaise(name.to_owned()),
            ("crash-on", worker) if worker.parse::<usize>().is_ok() => {
                Self::CrashOn(worker.parse().unwrap_or(0))
            }
            ("ps-fail", spec) => match spec.split_once(':').map(|(t, n)| (t.parse(), n.parse())) {
                Some((Ok(task), Ok(times))) => Self::PsFail { task, times },
                _ => Self::Unknown(text.into_owned()),
            },
            _ => Self::Unknown(text.into_owned()),
        }
    }
}

/// The resource ids an argument pickle names: `res:<id>,<id>…` at its start, up to `;`.
pub fn resource_ids(pickle: &[u8]) -> Vec<u64> {
    let Some(rest) = pickle.strip_prefix(b"res:") else {
        return Vec::new();
    };
    let end = rest.iter().position(|&b| b == b';').unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end])
        .split(',')
        .filter_map(|id| id.trim().parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_spell_behaviours() {
        assert_eq!(Behaviour::parse(b"echo"), Behaviour::Echo);
        assert_eq!(
            Behaviour::parse(b"sleep:25"),
            Behaviour::Sleep(Duration::from_millis(25))
        );
        assert_eq!(Behaviour::parse(b"gate:a"), Behaviour::Gate("a".into()));
        assert_eq!(Behaviour::parse(b"crash-on:2"), Behaviour::CrashOn(2));
        assert_eq!(
            Behaviour::parse(b"ps-fail:1:2"),
            Behaviour::PsFail { task: 1, times: 2 }
        );
        assert!(matches!(
            Behaviour::parse(b"ps-fail:x:2"),
            Behaviour::Unknown(_)
        ));
        assert_eq!(
            Behaviour::parse(b"sleep:soon"),
            Behaviour::Unknown("sleep:soon".into())
        );
    }

    #[test]
    fn resource_ids_are_read_from_the_argument_prefix() {
        assert_eq!(resource_ids(b"res:3,14;rest"), [3, 14]);
        assert_eq!(resource_ids(b"res:7"), [7]);
        assert!(resource_ids(b"plain").is_empty());
    }
}
