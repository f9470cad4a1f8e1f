//! The E2B envd face's road into a sandbox: the one other road to its agent beside the
//! native exec path, and like it a verb of the checked handle ([`Sandbox::envd`]).
//!
//! The face (the server's `e2b/envd.rs`) authenticates the request, picks the sandbox
//! through the handle and passes the request on as it came; here it is read under the
//! agent's own rules ([`record`]): an exec is recorded before it starts and held for
//! approval when the sandbox's policy says so (the same gate as [`Sandbox::start`]), its
//! output is hashed through the same redacting recorder as a native exec
//! ([`crate::exec::record`]), file changes are recorded once the agent answered, and what
//! cannot be read for the record is refused before it reaches the agent. The answer is
//! passed back as the agent gave it, read on its way.
//!
//! Only this crate and the agent speak the agent's protocol (Connect envelopes, its
//! messages, its `Authorization` rules): the face sees HTTP requests and answers.

pub(crate) mod body;
mod record;

use super::handle::Sandbox;
use crate::CoreError;
use body::EnvdBody;
use http::{Request, Response};
use rampart_agent::client::ClientError;

/// Why an envd request got no answer from the sandbox's agent.
#[derive(Debug, thiserror::Error)]
pub enum EnvdError {
    /// The sandbox is not running (it ended, or was paused, since it was looked up).
    #[error(transparent)]
    NotRunning(CoreError),
    /// The request did not reach the agent, or its answer did not come.
    #[error("agent request: {0}")]
    Forward(#[source] ClientError),
}

/// Sends `req` to the agent of `sandbox`, read and recorded on its way both ways (see the
/// module's doc). A request refused before the agent (it cannot be read for the record,
/// names a process that is not recorded, the approval was denied) is answered here, in the
/// protocol's own error form.
pub(super) async fn serve(
    sandbox: &Sandbox<'_>,
    req: Request<EnvdBody>,
) -> Result<Response<EnvdBody>, EnvdError> {
    let awake = sandbox.awake().await.map_err(EnvdError::NotRunning)?;
    let agent = &awake.client;
    // What must be recorded before the request reaches the agent is committed here; what
    // cannot be read for the record is refused here.
    let (req, tap) = match record::request(sandbox, req).await {
        Ok(x) => x,
        Err(refused) => return Ok(refused),
    };
    match agent.forward(req).await {
        Ok(resp) => {
            let (mut parts, b) = resp.into_parts();
            parts.headers.remove("x-rampart-agent-version");
            let resp = Response::from_parts(parts, body::boxed(b));
            let resp = record::answer(sandbox, tap, resp).await;
            // Awake until the answer is read to its end.
            Ok(match awake.activity {
                None => resp,
                Some(a) => resp.map(|b| {
                    body::boxed(http_body_util::BodyExt::map_frame(b, move |f| {
                        let _ = &a;
                        f
                    }))
                }),
            })
        }
        // Broken off on its way: a message that could not be read.
        Err(e) => match tap.refusal() {
            Some(refused) => Ok(refused),
            None => Err(EnvdError::Forward(e)),
        },
    }
}
