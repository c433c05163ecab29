//! Our side of the DFlash gate and benchmark (`cargo xtask gate dflash`,
//! `cargo xtask bench dflash`): plain and `dflash` speculative greedy
//! decoding of each prompt, recording what the drafter saw and did
//! (`block_trace`), so that `xtask/python/oracle_dflash.py` can replay the
//! same rounds through z-lab's `model_mlx.py`.
//!
//! `dflash_trace REQUEST.json`: a `run_protocol::dflash::DflashRequest`.
//! Reports a `DsparkTrace` on standard output (no confidences) and writes
//! the taps to the request's `taps` file.

mod block_trace;

use anyhow::Result;
use draft_dflash::{DFlashProvider, Options};
use run_protocol::dflash::DflashRequest;
use run_protocol::dspark::DsparkTrace;
use spec_core::ProviderOptions;

fn main() -> Result<()> {
    let args: DflashRequest = run_protocol::read_request()?;
    let target = block_trace::load_target(&args.target)?;
    let options = ProviderOptions::from([("model", args.drafter.display().to_string())]);
    let provider = DFlashProvider::new(&target, &Options::parse(&options)?)?;
    let requests = block_trace::trace(
        &target,
        &provider,
        &|target| Ok(Box::new(provider.source(target)?)),
        &args.prompts,
        args.max_tokens,
        args.num_draft,
        &args.taps,
    )?;
    run_protocol::write_report::<DflashRequest>(&DsparkTrace { requests })?;
    Ok(())
}
