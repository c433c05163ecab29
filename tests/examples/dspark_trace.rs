//! Our side of the DSpark gate and benchmark (`cargo xtask gate dspark`,
//! `cargo xtask bench dspark`): plain and `deepspec` speculative greedy
//! decoding of each prompt, recording everything the drafter saw and did
//! (`block_trace`), so that `xtask/python/oracle_dspark.py` can replay the
//! same rounds independently.
//!
//! `dspark_trace REQUEST.json`: a `run_protocol::dspark::DsparkRequest`.
//! Reports a `DsparkTrace` on standard output (the whole block's
//! confidence bits with its tokens) and writes the taps to the request's
//! `taps` file.

mod block_trace;

use anyhow::Result;
use draft_deepspec::{DSparkProvider, Options};
use run_protocol::dspark::{DsparkRequest, DsparkTrace};
use spec_core::ProviderOptions;

fn main() -> Result<()> {
    let args: DsparkRequest = run_protocol::read_request()?;
    let target = block_trace::load_target(&args.target)?;
    let options = ProviderOptions::from([
        ("model", args.drafter.display().to_string()),
        ("threshold", args.threshold.to_string()),
        ("dtype", args.drafter_dtype.as_str().to_owned()),
    ]);
    let provider = DSparkProvider::new(&target, &Options::parse(&options)?)?;
    let requests = block_trace::trace(
        &target,
        &provider,
        &|target| Ok(Box::new(provider.source(target)?)),
        &args.prompts,
        args.max_tokens,
        args.num_draft,
        &args.taps,
    )?;
    run_protocol::write_report::<DsparkRequest>(&DsparkTrace { requests })?;
    Ok(())
}
