//! Sending and receiving between neighbouring ranks, evaluated at once (MLX's
//! ring blocks a send until the peer receives it, so every exchange happens
//! in protocol order), with errors naming the peer.

use mlx_distributed::Group;
use mlx_rs::{Array, Dtype};

use crate::protocol::{Command, HEADER_LEN};
use crate::PipelineError;

/// Sends `x` to `peer` now; returns the bytes sent.
pub(crate) fn send(group: &Group, x: &Array, peer: usize) -> Result<usize, PipelineError> {
    let sent = group.send(x, peer)?;
    sent.eval().map_err(|source| PipelineError::Link {
        rank: group.rank(),
        what: "sending to",
        peer,
        source,
    })?;
    Ok(x.nbytes())
}

/// Receives a `shape` array of `dtype` from `peer` now.
pub(crate) fn recv(
    group: &Group,
    shape: &[i32],
    dtype: Dtype,
    peer: usize,
) -> Result<Array, PipelineError> {
    let x = group.recv(shape, dtype, peer)?;
    x.eval().map_err(|source| PipelineError::Link {
        rank: group.rank(),
        what: "receiving from",
        peer,
        source,
    })?;
    Ok(x)
}

/// Sends a command's header and body to `peer`; returns the bytes sent.
pub(crate) fn send_command(
    group: &Group,
    header: &[i32; HEADER_LEN],
    body: &[i32],
    peer: usize,
) -> Result<usize, PipelineError> {
    let mut bytes = send(
        group,
        &Array::from_slice(header, &[HEADER_LEN as i32]),
        peer,
    )?;
    if !body.is_empty() {
        bytes += send(group, &Array::from_slice(body, &[body.len() as i32]), peer)?;
    }
    Ok(bytes)
}

/// Receives a command from `peer`: its header and body (to relay as they
/// came) and what they say. A malformed command is an error naming this
/// rank and the peer, after reading no more than the header announces
/// within the protocol's limits; the caller then ends, closing its links.
pub(crate) fn recv_command(
    group: &Group,
    peer: usize,
) -> Result<([i32; HEADER_LEN], Vec<i32>, Command), PipelineError> {
    let rank = group.rank();
    let named = |e: PipelineError| match e {
        PipelineError::Protocol(m) => PipelineError::Protocol(format!(
            "rank {rank}: a malformed command from rank {peer}: {m}"
        )),
        other => other,
    };
    let h = recv(group, &[HEADER_LEN as i32], Dtype::Int32, peer)?;
    let header: [i32; HEADER_LEN] = h
        .as_slice::<i32>()
        .try_into()
        .map_err(|_| named(PipelineError::Protocol("a short command header".into())))?;
    let len = Command::body_len(&header).map_err(named)?;
    let body = if len == 0 {
        Vec::new()
    } else {
        let len = i32::try_from(len)
            .map_err(|_| named(PipelineError::Protocol(format!("a body of {len} values"))))?;
        recv(group, &[len], Dtype::Int32, peer)?
            .as_slice::<i32>()
            .to_vec()
    };
    let command = Command::decode(&header, &body).map_err(named)?;
    Ok((header, body, command))
}
