//! The variable store: named dense tensors, each behind its own lock.
//!
//! **Atomicity.** Every read and update of a variable holds that variable's mutex for the
//! whole copy or arithmetic, so concurrent `assign_add`s never lose an update and a read
//! never sees half of one. The name → variable map has its own `RwLock`, held only to look a
//! variable up (or, for create/delete/`assign_many`, to change the map); an update never
//! holds the map lock while it computes, and nothing takes the map lock while holding a
//! variable's, so the two cannot deadlock.
//!
//! **Checks first.** Every request is checked completely (dtype, shape, indices, names)
//! before the first byte is written, so a rejected request changes nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use bytes::Bytes;

use super::dtype::{apply, DType, Op};
use super::tensor::{describe, element_count, to_pb, TensorView};
use crate::rpc::pb;

/// Why a store operation was refused. Each message names the variable and what was seen
/// and expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// No variable of that name.
    #[error(
        "ps task {ps_index} holds no variable named {name:?} in this session ({held} \
         variables held); create it first, and note that a restarted ps has lost its \
         variables (restore them from a checkpoint), a vanished session's are released after \
         --state-ttl, and a re-attaching session takes them over"
    )]
    NotFound {
        /// The ps task's index.
        ps_index: i64,
        /// The name asked for.
        name: String,
        /// How many variables the ps holds.
        held: usize,
    },
    /// `CreateVariable` of a name that exists, without `replace`.
    #[error(
        "variable {name:?} already exists on ps task {ps_index} as {existing}; pass \
         replace=True to overwrite it or choose another name"
    )]
    AlreadyExists {
        /// The ps task's index.
        ps_index: i64,
        /// The name.
        name: String,
        /// The existing variable's dtype and shape.
        existing: String,
    },
    /// A value whose dtype or shape does not fit the variable.
    #[error("{op} to variable {name:?} ({expected}) got a {got} value; expected {want}")]
    Mismatch {
        /// The operation, e.g. `assign_add`.
        op: &'static str,
        /// The variable.
        name: String,
        /// The variable's dtype and shape.
        expected: String,
        /// The value's dtype and shape.
        got: String,
        /// What would have been accepted.
        want: String,
    },
    /// Any other malformed request.
    #[error("{0}")]
    Invalid(String),
    /// `Reattach` found the name, with another dtype or shape than asked for.
    #[error(
        "cannot re-attach variable {name:?} on ps task {ps_index}: the live one is {live}, \
         this program asks for {asked}; give the variable another name, or restore it from \
         a checkpoint made with the new shape"
    )]
    ReattachMismatch {
        /// The ps task's index.
        ps_index: i64,
        /// The name.
        name: String,
        /// The live variable's dtype and shape.
        live: String,
        /// The dtype and shape asked for.
        asked: String,
    },
}

impl StoreError {
    /// The gRPC status this error travels as.
    pub fn to_status(&self) -> tonic::Status {
        let message = self.to_string();
        match self {
            StoreError::NotFound { .. } => tonic::Status::not_found(message),
            StoreError::AlreadyExists { .. } => tonic::Status::already_exists(message),
            StoreError::Mismatch { .. } | StoreError::Invalid(_) => {
                tonic::Status::invalid_argument(message)
            }
            StoreError::ReattachMismatch { .. } => tonic::Status::failed_precondition(message),
        }
    }
}

/// Longest accepted variable name, in bytes.
pub const MAX_NAME_BYTES: usize = 4096;

fn check_name(name: &str) -> Result<(), StoreError> {
    if name.is_empty() {
        return Err(StoreError::Invalid(
            "a variable name is empty; expected a non-empty string".to_owned(),
        ));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(StoreError::Invalid(format!(
            "a variable name is {} bytes long; expected at most {MAX_NAME_BYTES}",
            name.len()
        )));
    }
    Ok(())
}

struct State {
    data: Vec<u8>,
    version: u64,
}

/// One variable: fixed dtype and shape, value and version behind a mutex.
pub struct Variable {
    dtype: DType,
    shape: Vec<usize>,
    state: Mutex<State>,
}

impl Variable {
    fn new(view: &TensorView<'_>) -> Self {
        Self {
            dtype: view.dtype,
            shape: view.shape.clone(),
            state: Mutex::new(State {
                data: view.data.to_vec(),
                version: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; if something did, the bytes are still a
        // valid tensor, so keep serving rather than poisoning the variable forever.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `dtype[d0, d1, ...]`, for messages.
    pub(crate) fn describe(&self) -> String {
        describe(self.dtype, &self.shape)
    }

    /// Whether the variable has exactly this dtype and shape.
    pub(crate) fn is(&self, dtype: DType, shape: &[usize]) -> bool {
        self.dtype == dtype && self.shape == shape
    }

    fn snapshot(&self, state: &State) -> pb::Tensor {
        to_pb(self.dtype, &self.shape, Bytes::copy_from_slice(&state.data))
    }

    /// Checks that `value` has exactly this variable's dtype and shape.
    fn check(
        &self,
        name: &str,
        op: &'static str,
        value: &TensorView<'_>,
    ) -> Result<(), StoreError> {
        if value.dtype != self.dtype || value.shape != self.shape {
            let want = if value.dtype == self.dtype {
                format!("shape {:?}", self.shape)
            } else {
                format!("dtype {}", self.dtype)
            };
            return Err(StoreError::Mismatch {
                op,
                name: name.to_owned(),
                expected: self.describe(),
                got: value.describe(),
                want: format!("{want} (the variable's; values are not cast or broadcast)"),
            });
        }
        Ok(())
    }
}

/// A variable and its optimizer slots and step counts, by name, moving between sessions.
pub(crate) type Family = Vec<(String, Arc<Variable>)>;

/// What an update returns: the new version and, if asked, the value right after it.
pub type Updated = (u64, Option<pb::Tensor>);

/// Whether `rest` (what follows `<name>/`) names a slot or step count:
/// `<optimizer>/<slot>`, both parts non-empty.
fn is_slot_suffix(rest: &str) -> bool {
    let mut parts = rest.split('/');
    matches!(
        (parts.next(), parts.next(), parts.next()),
        (Some(a), Some(b), None) if !a.is_empty() && !b.is_empty()
    )
}

/// The variables of one session on one ps task (see `sessions.rs` for the sessions).
pub struct VariableStore {
    ps_index: i64,
    vars: RwLock<HashMap<String, Arc<Variable>>>,
}

impl VariableStore {
    /// An empty store for ps task `ps_index` (used in messages).
    pub fn new(ps_index: i64) -> Self {
        Self {
            ps_index,
            vars: RwLock::default(),
        }
    }

    fn map(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<Variable>>> {
        self.vars.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn map_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<Variable>>> {
        self.vars.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn not_found(&self, name: &str, held: usize) -> StoreError {
        StoreError::NotFound {
            ps_index: self.ps_index,
            name: name.to_owned(),
            held,
        }
    }

    fn get(&self, name: &str) -> Result<Arc<Variable>, StoreError> {
        let map = self.map();
        map.get(name)
            .cloned()
            .ok_or_else(|| self.not_found(name, map.len()))
    }

    /// Number of variables and bytes of variable data held.
    pub fn usage(&self) -> (usize, usize) {
        let map = self.map();
        let bytes = map
            .values()
            .map(|v| element_count(&v.shape).unwrap_or(0) * v.dtype.size())
            .sum();
        (map.len(), bytes)
    }

    /// Creates `name` holding `value`; returns whether an existing variable was replaced.
    pub fn create(
        &self,
        name: &str,
        value: &TensorView<'_>,
        replace: bool,
    ) -> Result<bool, StoreError> {
        check_name(name)?;
        let mut map = self.map_mut();
        if let Some(existing) = map.get(name) {
            if !replace {
                return Err(StoreError::AlreadyExists {
                    ps_index: self.ps_index,
                    name: name.to_owned(),
                    existing: existing.describe(),
                });
            }
        }
        Ok(map
            .insert(name.to_owned(), Arc::new(Variable::new(value)))
            .is_some())
    }

    /// A consistent copy of `name` and its version.
    pub fn read(&self, name: &str) -> Result<(pb::Tensor, u64), StoreError> {
        let var = self.get(name)?;
        let state = var.lock();
        Ok((var.snapshot(&state), state.version))
    }

    /// Applies `op` with `value` to `name` atomically.
    pub fn update(
        &self,
        name: &str,
        op: Op,
        value: &TensorView<'_>,
        read_value: bool,
    ) -> Result<Updated, StoreError> {
        let var = self.get(name)?;
        var.check(name, op.verb(), value)?;
        let mut state = var.lock();
        apply(var.dtype, op, &mut state.data, value.data);
        state.version += 1;
        let after = read_value.then(|| var.snapshot(&state));
        Ok((state.version, after))
    }

    /// `name[indices[i], ...] += updates[i, ...]` atomically; every index is checked first.
    pub fn scatter_add(
        &self,
        name: &str,
        indices: &[i64],
        updates: &TensorView<'_>,
        read_value: bool,
    ) -> Result<Updated, StoreError> {
        let var = self.get(name)?;
        let Some((&rows, row_shape)) = var.shape.split_first() else {
            return Err(StoreError::Invalid(format!(
                "scatter_add to variable {name:?} ({}): a scalar has no rows to scatter \
                 into; expected a variable of rank 1 or more (use assign_add)",
                var.describe()
            )));
        };
        let mut want_shape = vec![indices.len()];
        want_shape.extend_from_slice(row_shape);
        if updates.dtype != var.dtype || updates.shape != want_shape {
            return Err(StoreError::Mismatch {
                op: "scatter_add",
                name: name.to_owned(),
                expected: var.describe(),
                got: updates.describe(),
                want: format!(
                    "updates of {} ([len(indices)] + the variable's shape without axis 0)",
                    describe(var.dtype, &want_shape)
                ),
            });
        }
        let mut offsets = Vec::with_capacity(indices.len());
        for (position, &index) in indices.iter().enumerate() {
            match usize::try_from(index) {
                Ok(row) if row < rows => offsets.push(row),
                _ => {
                    return Err(StoreError::Invalid(format!(
                        "scatter_add to variable {name:?} ({}): indices[{position}] = {index} \
                         is out of range; expected 0 <= index < {rows} (rows of axis 0)",
                        var.describe()
                    )))
                }
            }
        }
        let row_bytes = element_count(row_shape).unwrap_or(0) * var.dtype.size();
        let mut state = var.lock();
        for (i, row) in offsets.into_iter().enumerate() {
            let src = &updates.data[i * row_bytes..(i + 1) * row_bytes];
            let dst = &mut state.data[row * row_bytes..(row + 1) * row_bytes];
            apply(var.dtype, Op::Add, dst, src);
        }
        state.version += 1;
        let after = read_value.then(|| var.snapshot(&state));
        Ok((state.version, after))
    }

    /// Name, dtype, shape and version of every variable, sorted by name.
    pub fn list(&self) -> Vec<pb::VariableInfo> {
        let vars: BTreeMap<String, Arc<Variable>> = self
            .map()
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect();
        vars.into_iter()
            .map(|(name, var)| pb::VariableInfo {
                name,
                dtype: var.dtype.to_pb().into(),
                shape: var.shape.iter().map(|&d| d as u64).collect(),
                version: var.lock().version,
            })
            .collect()
    }

    /// Copies of `names` in order (every variable, sorted by name, when empty).
    pub fn read_many(&self, names: &[String]) -> Result<Vec<pb::NamedTensor>, StoreError> {
        let chosen: Vec<(String, Arc<Variable>)> = {
            let map = self.map();
            if names.is_empty() {
                let mut all: Vec<_> = map
                    .iter()
                    .map(|(k, v)| (k.clone(), Arc::clone(v)))
                    .collect();
                all.sort_by(|a, b| a.0.cmp(&b.0));
                all
            } else {
                names
                    .iter()
                    .map(|n| {
                        map.get(n)
                            .map(|v| (n.clone(), Arc::clone(v)))
                            .ok_or_else(|| self.not_found(n, map.len()))
                    })
                    .collect::<Result<_, _>>()?
            }
        };
        Ok(chosen
            .into_iter()
            .map(|(name, var)| {
                let state = var.lock();
                pb::NamedTensor {
                    name,
                    value: Some(var.snapshot(&state)),
                    version: state.version,
                }
            })
            .collect())
    }

    /// Assigns every item, creating missing variables when `create_missing`; checks every
    /// item before writing any. Returns `(assigned, created)`.
    pub fn assign_many(
        &self,
        items: &[(String, TensorView<'_>)],
        create_missing: bool,
    ) -> Result<(u32, u32), StoreError> {
        // The map's write lock for the whole call: no variable appears or vanishes between
        // the checks and the writes.
        let mut map = self.map_mut();
        let mut seen = std::collections::HashSet::new();
        for (name, value) in items {
            check_name(name)?;
            if !seen.insert(name.as_str()) {
                return Err(StoreError::Invalid(format!(
                    "assign_many names variable {name:?} twice; expected each name once"
                )));
            }
            match map.get(name) {
                Some(var) => var.check(name, "assign", value)?,
                None if create_missing => {}
                None => return Err(self.not_found(name, map.len())),
            }
        }
        let (mut assigned, mut created) = (0u32, 0u32);
        for (name, value) in items {
            if let Some(var) = map.get(name) {
                let mut state = var.lock();
                apply(var.dtype, Op::Assign, &mut state.data, value.data);
                state.version += 1;
                assigned += 1;
            } else {
                map.insert(name.clone(), Arc::new(Variable::new(value)));
                created += 1;
            }
        }
        Ok((assigned, created))
    }

    /// Removes and returns `name` and its optimizer slots and step counts (every
    /// `<name>/<optimizer>/<slot>`), for a session adopting them; `None` (nothing removed)
    /// when `name` is absent. `check` sees the variable first and may refuse.
    pub(crate) fn take_family(
        &self,
        name: &str,
        check: impl FnOnce(&Variable) -> Result<(), StoreError>,
    ) -> Result<Option<Family>, StoreError> {
        let mut map = self.map_mut();
        let Some(variable) = map.get(name) else {
            return Ok(None);
        };
        check(variable)?;
        let prefix = format!("{name}/");
        let family: Vec<String> = map
            .keys()
            .filter(|key| {
                key.as_str() == name || key.strip_prefix(&prefix).is_some_and(is_slot_suffix)
            })
            .cloned()
            .collect();
        Ok(Some(
            family
                .into_iter()
                .filter_map(|key| map.remove(&key).map(|var| (key, var)))
                .collect(),
        ))
    }

    /// Adds variables another session held (see [`VariableStore::take_family`]), replacing
    /// any of the same names.
    pub(crate) fn adopt(&self, family: Family) {
        let mut map = self.map_mut();
        for (name, variable) in family {
            map.insert(name, variable);
        }
    }

    /// Drops `names`; returns how many existed.
    pub fn delete(&self, names: &[String]) -> u32 {
        let mut map = self.map_mut();
        names
            .iter()
            .filter(|n| map.remove(n.as_str()).is_some())
            .count() as u32
    }
}

/// Optimizer steps (`ApplyUpdate`), a child module so that it shares the variables' locks.
#[path = "store_optim.rs"]
pub mod optim_apply;

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
