//! A manifest's paths as the tree they make, and its symbolic links
//! resolved in that tree the way the kernel resolves them.
//!
//! [`PathTree`] is built once per validation, in time linear in the
//! manifest's bytes: one node per listed path and per directory a path
//! implies, found by `(parent, name)` in a hash table (std's randomly
//! keyed hasher: a hostile manifest cannot force collisions). Building it
//! finds duplicates and entries below a file or a symbolic link, in any
//! order of entries.
//!
//! [`PathTree::resolve_links`] follows every symbolic link's target from
//! the directory holding the link, component by component: `..` climbs
//! from where the walk *is* (after a link was followed, from its target,
//! as the kernel does), a component naming a listed link is replaced by
//! that link's own resolution, and at most [`MAX_LINKS`] links are
//! followed in one resolution (the kernel's `MAXSYMLINKS`). A link is
//! inside only if no step of its resolution leaves the tree: an absolute
//! target, or a `..` above the destination, anywhere in the chain, makes
//! it escape. A component the manifest does not list (or one below a
//! file) is taken as a plain directory the walk may enter and climb back
//! from, so a name that does not exist yet hides no climb either.
//!
//! Each link is resolved once: its result (where it leads and how many
//! links that followed) does not depend on how the walk reached it, so a
//! link named by a thousand others costs its target's length once, not a
//! thousand times. Resolution uses an explicit stack, not recursion: a
//! chain of a million links cannot overflow the thread's stack.

use std::collections::HashMap;

/// The most symbolic links one resolution follows, as Linux
/// (`MAXSYMLINKS`): one more fails with `ELOOP`.
pub const MAX_LINKS: u32 = 40;

/// No node (an implied directory lists no entry).
const NONE: u32 = u32::MAX;

/// What a node of the tree is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeKind {
    /// A directory, listed or implied by a path below it.
    Dir,
    /// A regular file.
    File,
    /// A symbolic link.
    Link,
}

/// One path of the tree.
#[derive(Debug, Clone)]
pub(crate) struct Node<'m> {
    /// The parent node ([`NONE`] for the root).
    pub parent: u32,
    /// The manifest entry at this path ([`NONE`] when only implied).
    pub entry: u32,
    /// The path, relative to the destination (`""` for the root).
    pub path: &'m str,
    pub kind: NodeKind,
}

/// Why a manifest's paths do not make a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TreeError {
    /// Entry `.0` lists a path that entry `.1` lists already.
    Twice(usize),
    /// Entry `.0` is below the path of entry `.1`, which is not a
    /// directory.
    Below(usize, usize),
}

/// A manifest's paths as a tree (node 0 is the destination; every parent
/// comes before its children).
#[derive(Debug)]
pub(crate) struct PathTree<'m> {
    pub nodes: Vec<Node<'m>>,
    /// The node of each entry, by entry index.
    pub of_entry: Vec<u32>,
    children: HashMap<(u32, &'m str), u32>,
}

/// Where a symbolic link leads, resolved in the manifest's own tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkVerdict {
    /// Every step of the resolution stays inside the destination.
    Inside,
    /// The target is absolute, or climbs above the destination at some
    /// step (through other links of the manifest, perhaps).
    Outside,
    /// Resolving it follows more than [`MAX_LINKS`] links (a loop, or a
    /// chain the kernel refuses with `ELOOP`).
    TooManyLinks,
}

/// A link's memoized resolution.
#[derive(Debug, Clone, Copy)]
enum Memo {
    Unvisited,
    InProgress,
    /// At node `node`, `virt` levels down into names the manifest does
    /// not list, having followed `links` links (not counting itself).
    At {
        node: u32,
        virt: u32,
        links: u32,
    },
    Failed(LinkVerdict),
}

/// A walk in progress: the link being resolved and where it is.
struct Frame<'m> {
    link: u32,
    rest: std::str::Split<'m, char>,
    node: u32,
    virt: u32,
    links: u32,
}

impl<'m> PathTree<'m> {
    /// The tree of `paths` (already checked to be plain relative paths)
    /// with their kinds.
    pub fn build(
        entries: impl ExactSizeIterator<Item = (&'m str, NodeKind)>,
    ) -> Result<Self, TreeError> {
        let n = entries.len();
        let mut t = PathTree {
            nodes: Vec::with_capacity(n + 1),
            of_entry: Vec::with_capacity(n),
            children: HashMap::with_capacity(n),
        };
        t.nodes.push(Node {
            parent: NONE,
            entry: NONE,
            path: "",
            kind: NodeKind::Dir,
        });
        for (i, (path, kind)) in entries.enumerate() {
            let i = i as u32;
            let mut cur = 0u32;
            let mut start = 0;
            loop {
                let end = path[start..].find('/').map_or(path.len(), |k| start + k);
                let name = &path[start..end];
                let last = end == path.len();
                let here = t.nodes[cur as usize].clone();
                if here.kind != NodeKind::Dir {
                    return Err(TreeError::Below(i as usize, here.entry as usize));
                }
                match t.children.get(&(cur, name)) {
                    Some(&c) if last => {
                        let node = &mut t.nodes[c as usize];
                        if node.entry != NONE {
                            return Err(TreeError::Twice(node.entry as usize));
                        }
                        // An implied directory, listed now.
                        if kind != NodeKind::Dir {
                            let below = t
                                .of_entry
                                .iter()
                                .position(|&e| {
                                    let mut p = e;
                                    while p != NONE {
                                        p = t.nodes[p as usize].parent;
                                        if p == c {
                                            return true;
                                        }
                                    }
                                    false
                                })
                                .unwrap_or(0);
                            return Err(TreeError::Below(below, i as usize));
                        }
                        node.entry = i;
                        t.of_entry.push(c);
                    }
                    Some(&c) => cur = c,
                    None => {
                        let id = t.nodes.len() as u32;
                        t.nodes.push(Node {
                            parent: cur,
                            entry: if last { i } else { NONE },
                            path: &path[..end],
                            kind: if last { kind } else { NodeKind::Dir },
                        });
                        t.children.insert((cur, name), id);
                        if last {
                            t.of_entry.push(id);
                        }
                        cur = id;
                    }
                }
                if last {
                    break;
                }
                start = end + 1;
            }
        }
        Ok(t)
    }

    /// Resolve every symbolic link; `target(entry)` gives an entry's
    /// target. Returns each link node's verdict, in node order.
    pub fn resolve_links(&self, target: impl Fn(u32) -> &'m str) -> Vec<(u32, LinkVerdict)> {
        let mut memo: HashMap<u32, Memo> = HashMap::new();
        let mut out = Vec::new();
        for (id, node) in self.nodes.iter().enumerate() {
            if node.kind != NodeKind::Link {
                continue;
            }
            let id = id as u32;
            self.resolve(id, &target, &mut memo);
            let verdict = match memo.get(&id) {
                Some(Memo::At { links, .. }) if *links < MAX_LINKS => LinkVerdict::Inside,
                Some(Memo::At { .. }) => LinkVerdict::TooManyLinks,
                Some(Memo::Failed(v)) => *v,
                _ => LinkVerdict::TooManyLinks,
            };
            out.push((id, verdict));
        }
        out
    }

    /// Resolve link `start` (and every link it needs) into `memo`.
    fn resolve(&self, start: u32, target: &impl Fn(u32) -> &'m str, memo: &mut HashMap<u32, Memo>) {
        if !matches!(
            memo.get(&start).unwrap_or(&Memo::Unvisited),
            Memo::Unvisited
        ) {
            return;
        }
        let mut stack: Vec<Frame<'m>> = Vec::new();
        let push = |stack: &mut Vec<Frame<'m>>, memo: &mut HashMap<u32, Memo>, link: u32| {
            let t = target(self.nodes[link as usize].entry);
            if t.starts_with('/') {
                memo.insert(link, Memo::Failed(LinkVerdict::Outside));
                return Err(LinkVerdict::Outside);
            }
            memo.insert(link, Memo::InProgress);
            stack.push(Frame {
                link,
                rest: t.split('/'),
                node: self.nodes[link as usize].parent,
                virt: 0,
                links: 0,
            });
            Ok(())
        };
        // Every frame on the stack shares the fate of one that fails:
        // each needs the next one's resolution.
        let fail_all = |stack: &mut Vec<Frame<'m>>, memo: &mut HashMap<u32, Memo>, v| {
            for f in stack.drain(..) {
                memo.insert(f.link, Memo::Failed(v));
            }
        };
        if push(&mut stack, memo, start).is_err() {
            return;
        }
        while let Some(top) = stack.last_mut() {
            let Some(c) = top.rest.next() else {
                let f = stack.pop().expect("a frame");
                let done = Memo::At {
                    node: f.node,
                    virt: f.virt,
                    links: f.links,
                };
                memo.insert(f.link, done);
                if let Some(below) = stack.last_mut() {
                    if let Err(v) = Self::enter(below, f.node, f.virt, f.links) {
                        fail_all(&mut stack, memo, v);
                    }
                }
                continue;
            };
            match c {
                "" | "." => {}
                ".." => {
                    if top.virt > 0 {
                        top.virt -= 1;
                    } else if top.node == 0 {
                        fail_all(&mut stack, memo, LinkVerdict::Outside);
                    } else {
                        top.node = self.nodes[top.node as usize].parent;
                    }
                }
                name => {
                    if top.virt > 0 {
                        top.virt = top.virt.saturating_add(1);
                        continue;
                    }
                    match self.children.get(&(top.node, name)) {
                        None => top.virt = 1,
                        Some(&c) if self.nodes[c as usize].kind != NodeKind::Link => top.node = c,
                        Some(&c) => match memo.get(&c).copied().unwrap_or(Memo::Unvisited) {
                            Memo::At { node, virt, links } => {
                                if let Err(v) = Self::enter(top, node, virt, links) {
                                    fail_all(&mut stack, memo, v);
                                }
                            }
                            Memo::Failed(v) => fail_all(&mut stack, memo, v),
                            // A link that needs itself: the kernel follows
                            // it until it gives up.
                            Memo::InProgress => {
                                fail_all(&mut stack, memo, LinkVerdict::TooManyLinks)
                            }
                            Memo::Unvisited => {
                                if let Err(v) = push(&mut stack, memo, c) {
                                    fail_all(&mut stack, memo, v);
                                }
                            }
                        },
                    }
                }
            }
        }
    }

    /// Continue `f`'s walk at a followed link's resolution.
    fn enter(f: &mut Frame<'_>, node: u32, virt: u32, links: u32) -> Result<(), LinkVerdict> {
        f.links = f.links.saturating_add(1).saturating_add(links);
        if f.links > MAX_LINKS {
            return Err(LinkVerdict::TooManyLinks);
        }
        f.node = node;
        f.virt = virt;
        Ok(())
    }
}
