//! An answer printed as its tokens come: incremental decoding and stop
//! strings, as `generate` and `chat` print it.

use std::io::Write;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result};
use serve_loop::{Completion, Engine, Finish, Request, StopMatcher};
use spec_text::{StreamDecoder, Tokenizer};

/// Prints the text as tokens come: incremental decoding, stop strings.
pub struct Printer {
    /// The tokenizer it decodes with.
    pub tokenizer: Arc<Tokenizer>,
    decoder: StreamDecoder<'static>,
    stops: StopMatcher,
    failure: Option<anyhow::Error>,
}

impl Printer {
    /// Decodes with `tokenizer`; the text ends before the first of `stops`.
    /// Special tokens the model writes (gpt-oss's harmony markers, Gemma
    /// 4's channel) are printed, as mlx-lm's detokenizers print them; the
    /// end-of-sequence token ends the answer unprinted.
    pub fn new(tokenizer: Arc<Tokenizer>, stops: &[String]) -> Self {
        Self {
            decoder: StreamDecoder::shared(Arc::clone(&tokenizer), false),
            tokenizer,
            stops: StopMatcher::new(stops.iter().cloned()),
            failure: None,
        }
    }

    /// Prints a token's text as soon as it is whole; breaks at a stop
    /// string or a failure.
    pub fn token(&mut self, token: u32) -> ControlFlow<()> {
        let piece = match self.decoder.step(token) {
            Ok(p) => p,
            Err(e) => {
                self.failure = Some(e.into());
                return ControlFlow::Break(());
            }
        };
        let (text, stopped) = self.stops.push(&piece);
        let mut stdout = std::io::stdout();
        if let Err(e) = stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
        {
            self.failure = Some(e.into());
            return ControlFlow::Break(());
        }
        if stopped {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }

    /// Prints what was held back (unless a stop string ended the text).
    pub fn finish(mut self, finish: Finish) -> Result<()> {
        if let Some(e) = self.failure {
            return Err(e);
        }
        if finish != Finish::Stopped {
            let (tail, _) = self.stops.push(&self.decoder.finish()?);
            print!("{tail}{}", self.stops.finish());
        }
        println!();
        Ok(())
    }
}

/// Runs `request` on `engine`, `printer` printing its tokens as the engine
/// emits them (its `on_token`), then what the printer held back.
pub fn run_printed(engine: &Engine, mut request: Request, printer: Printer) -> Result<Completion> {
    let printer = Arc::new(Mutex::new(Some(printer)));
    let hook = Arc::clone(&printer);
    request.on_token = Some(Box::new(move |e: &serve_loop::Emitted<'_>| {
        let mut printer = hook.lock().unwrap_or_else(PoisonError::into_inner);
        printer
            .as_mut()
            .map_or(ControlFlow::Break(()), |p| p.token(e.token))
    }));
    let done = engine.submit(request)?.wait()?;
    let printer = printer
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .context("the printer is gone")?;
    printer.finish(done.output.finish)?;
    Ok(done)
}
