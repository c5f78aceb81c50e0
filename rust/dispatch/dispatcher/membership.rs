//! Workers joining and leaving while closures run (`add_workers`, `remove_workers`), and
//! the worker table as the one place that knows it (addresses, removed, in service).

use std::time::Duration;

use tokio::task::JoinHandle;

use super::{await_links, Dispatcher};
use crate::dispatch::closure::Work;
use crate::dispatch::status::LinkState;
use crate::dispatch::transport::WorkerTransport;
use crate::dispatch::DispatchError;
use crate::queue::Tag;

impl Dispatcher {
    /// Adds workers while closures run (elastic clusters): each gets the next index (an
    /// index is never reused), connects in the background like the first ones, builds
    /// every live per-worker resource, then takes closures. Returns the new indices.
    pub fn add_workers<T: WorkerTransport>(
        &self,
        transports: Vec<T>,
    ) -> Result<Vec<usize>, DispatchError> {
        self.add_slices(transports, 1)
    }

    /// [`add_workers`](Self::add_workers) for multi-host slices: each transport reaches
    /// the rank-0 host of a slice that must have `slice_size` hosts (its link uses the
    /// worker only once it reports being rank 0 of a slice that size, so half a slice is
    /// never used). `slice_size` 1: workers of their own.
    pub fn add_slices<T: WorkerTransport>(
        &self,
        transports: Vec<T>,
        slice_size: u32,
    ) -> Result<Vec<usize>, DispatchError> {
        if self.is_shut_down() {
            return Err(DispatchError::Stopped);
        }
        self.start_links(
            transports
                .into_iter()
                .map(|transport| (transport, slice_size))
                .collect(),
        )
    }

    /// Removes workers `indices` and waits until each has left: a worker's link stops
    /// taking closures, lets what its worker is running (and has queued) finish and
    /// collects the results — a worker that is down has already given its closures back —
    /// releases the worker's per-worker resources, and ends. Nothing is lost: a closure
    /// whose result does not arrive runs elsewhere. Refused (nothing removed) for an
    /// unknown or already removed index, or if no worker able to run closures would
    /// remain.
    pub fn remove_workers(&self, indices: &[usize]) -> Result<(), DispatchError> {
        let removal = self.begin_removal(indices)?;
        await_links(removal.tasks);
        Ok(())
    }

    /// The first half of [`remove_workers`](Self::remove_workers): checks `indices` and
    /// asks each of those workers to leave, without waiting for them. The links leave on
    /// their own; the [`Removal`] waits for that in slices (so a binding can check for
    /// Ctrl-C between them), and dropping it waits no more.
    pub fn begin_removal(&self, indices: &[usize]) -> Result<Removal, DispatchError> {
        let leaving = {
            let _membership = self.lock_membership();
            let links = self.shared.link_statuses();
            let mut leaving: Vec<usize> = Vec::with_capacity(indices.len());
            for &index in indices {
                let Some(link) = links.get(index) else {
                    return Err(DispatchError::InvalidArgument(format!(
                        "remove_workers(): there is no worker {index}; the indices are 0 to {}",
                        links.len().saturating_sub(1)
                    )));
                };
                if link.is_retiring() || link.state() == LinkState::Removed {
                    return Err(DispatchError::InvalidArgument(format!(
                        "remove_workers(): worker {index} ({}) was already removed",
                        link.address()
                    )));
                }
                if !leaving.contains(&index) {
                    leaving.push(index);
                }
            }
            let remaining = links
                .iter()
                .filter(|link| {
                    !leaving.contains(&link.index())
                        && !link.is_retiring()
                        && !link.state().is_out_of_service()
                })
                .count();
            if remaining == 0 {
                return Err(DispatchError::InvalidArgument(format!(
                    "remove_workers(): removing workers {leaving:?} would leave no worker able \
                     to run closures; add workers first (add_workers) or shut the \
                     coordinator down"
                )));
            }
            for &index in &leaving {
                links[index].begin_retiring();
                // Wakes the link if it waits for work; served before any closure.
                let _ = self.shared.queue.try_put(Work::Retire, Some(index as Tag));
            }
            leaving
        };
        let tasks: Vec<JoinHandle<()>> = {
            let mut links = self.lock_links();
            leaving
                .iter()
                .filter_map(|index| links.remove(index))
                .collect()
        };
        Ok(Removal { tasks })
    }

    /// Every worker's address, by index (removed ones included: indices are never
    /// reused). The dispatcher is the one owner of this table.
    pub fn addresses(&self) -> Vec<String> {
        self.shared
            .link_statuses()
            .iter()
            .map(|link| link.address().to_owned())
            .collect()
    }

    /// Whether worker `index` was removed (or is leaving: `remove_workers` began).
    /// `false` for an index out of range.
    pub fn is_removed(&self, index: usize) -> bool {
        self.shared
            .link(index)
            .is_some_and(|link| link.is_retiring() || link.state() == LinkState::Removed)
    }

    /// `(address, index)` of every worker not removed, by index; given-up workers
    /// included (they are still the cluster's until removed).
    pub fn active(&self) -> Vec<(String, usize)> {
        self.shared
            .link_statuses()
            .iter()
            .filter(|link| !link.is_retiring() && link.state() != LinkState::Removed)
            .map(|link| (link.address().to_owned(), link.index()))
            .collect()
    }

    /// Addresses of the workers whose link gave up reconnecting (and not removed).
    pub fn given_up(&self) -> Vec<String> {
        self.shared
            .link_statuses()
            .iter()
            .filter(|link| !link.is_retiring() && link.state() == LinkState::GivenUp)
            .map(|link| link.address().to_owned())
            .collect()
    }
}

/// Workers asked to leave ([`Dispatcher::begin_removal`]), not yet awaited.
#[derive(Debug)]
pub struct Removal {
    tasks: Vec<JoinHandle<()>>,
}

impl Removal {
    /// Waits up to `slice` for the leaving links to end; `true` once every one has (a
    /// link that panicked has ended too). Call from a thread outside the runtime.
    pub fn wait(&mut self, slice: Duration) -> bool {
        if self.tasks.is_empty() {
            return true;
        }
        let Ok(runtime) = crate::runtime::runtime() else {
            return true; // no runtime (a forked child): nothing runs the links any more
        };
        let tasks = &mut self.tasks;
        runtime.block_on(async {
            let all = async {
                while let Some(task) = tasks.last_mut() {
                    let _ = task.await;
                    tasks.pop();
                }
            };
            let _ = tokio::time::timeout(slice, all).await;
        });
        self.tasks.is_empty()
    }
}
