//! Which configured workspaces each node serves in its current connection
//! generation: a node says which it refused before it is ready, and the
//! coordinator admits a workspace only when the generation it freezes said
//! so (no word yet, or a word from another generation, fails closed).

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::registry::Generation;

/// The refusals each node reported, with the generation they are for.
#[derive(Debug, Default)]
pub struct Served {
    nodes: Mutex<HashMap<String, (Generation, Vec<String>)>>,
}

/// Whether a node's generation serves a workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serving {
    /// It said it serves it.
    Yes,
    /// It refused it.
    Refused,
    /// That generation has not said (not ready yet, or another one did).
    Unknown,
}

impl Served {
    /// A link of `node`'s `generation` reported `refused` before ready
    /// (every link says the same; the last word wins).
    pub fn record(&self, node: &str, generation: Generation, refused: Vec<String>) {
        self.nodes.lock().insert(node.to_owned(), (generation, refused));
    }

    /// Whether `generation` of `node` serves `reference`.
    pub fn serving(&self, node: &str, generation: Generation, reference: &str) -> Serving {
        match self.nodes.lock().get(node) {
            Some((g, refused)) if *g == generation => {
                if refused.iter().any(|r| r == reference) {
                    Serving::Refused
                } else {
                    Serving::Yes
                }
            }
            _ => Serving::Unknown,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn only_the_generation_that_said_counts() {
        let s = Served::default();
        assert_eq!(s.serving("n", 1, "w"), Serving::Unknown);
        s.record("n", 1, vec!["bad".into()]);
        assert_eq!(s.serving("n", 1, "w"), Serving::Yes);
        assert_eq!(s.serving("n", 1, "bad"), Serving::Refused);
        assert_eq!(s.serving("n", 2, "w"), Serving::Unknown);
        s.record("n", 2, vec![]);
        assert_eq!(s.serving("n", 1, "w"), Serving::Unknown);
        assert_eq!(s.serving("n", 2, "bad"), Serving::Yes);
    }
}
