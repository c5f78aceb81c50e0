//! `Reattach` on the ps: a restarted program's session takes over a vanished session's
//! variable. The variable and its optimizer slots, left by a session of the same token,
//! move over instead of being made anew.

use tonic::Status;

use super::PsShared;
use crate::ps::dtype::DType;
use crate::rpc::pb;
use crate::rpc::wire::session::SessionId;

impl PsShared {
    /// Finds `request`'s variable in another session (a vanished one first) and moves it
    /// into `session`; `found: false` when there is none.
    pub(super) fn reattach(
        &self,
        session: &SessionId,
        request: &pb::ReattachRequest,
    ) -> Result<pb::ReattachResponse, Status> {
        let dtype = DType::from_pb(request.dtype).map_err(|e| {
            self.reject(Status::invalid_argument(format!(
                "reattach of {:?}: {e}",
                request.name
            )))
        })?;
        let shape = request
            .shape
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| {
                self.reject(Status::invalid_argument(format!(
                    "reattach of {:?}: a dimension does not fit this machine's address space",
                    request.name
                )))
            })?;
        // Sessions still connected are searched last: a vanished predecessor's variable is
        // the one a restarted program means.
        let connected: std::collections::HashSet<SessionId> = self
            .registry
            .snapshot()
            .into_iter()
            .filter(|tracked| tracked.connections > 0)
            .map(|tracked| tracked.id)
            .collect();
        let found = self
            .sessions
            .reattach(session, &request.name, dtype, &shape, |other| {
                !connected.contains(other)
            })
            .map_err(|e| self.store_error(&e))?;
        Ok(match found {
            None => pb::ReattachResponse::default(),
            Some(found) => {
                if let Some(from) = &found.from {
                    tracing::info!(
                        target: crate::log_target::PS,
                        "session {session} re-attached variable {:?} ({} slots) from session \
                         {from}",
                        request.name,
                        found.slots.len()
                    );
                }
                pb::ReattachResponse {
                    found: true,
                    slots: found.slots,
                }
            }
        })
    }
}
