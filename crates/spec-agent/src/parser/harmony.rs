//! gpt-oss's harmony format. A response is a run of messages, each a header
//! (`<|channel|>NAME`, perhaps a recipient ` to=functions.F` and a
//! ` <|constrain|>json`; from the second message on after
//! `<|start|>assistant`), `<|message|>`, the body, and an end: `<|end|>`, or
//! `<|call|>` / `<|return|>`, which end generation. The `analysis` channel is
//! reasoning, `final` and `commentary` without a recipient are content, a
//! message to `functions.NAME` is a call whose body is its JSON arguments.
//! The recipient may also stand before the channel (`assistant
//! to=functions.F<|channel|>commentary json`, as the template writes calls
//! into the history).

use serde_json::Value;

use super::scan;
use super::{OutputParser, Piece, State};

pub(crate) const START: &str = "<|start|>";
pub(crate) const CHANNEL: &str = "<|channel|>";
pub(crate) const MESSAGE: &str = "<|message|>";
pub(crate) const END: &str = "<|end|>";
pub(crate) const CALL: &str = "<|call|>";
pub(crate) const RETURN: &str = "<|return|>";
/// Where a message's body ends (a new `<|start|>` too, for a model that
/// skips the end).
const BODY_ENDS: [&str; 4] = [END, CALL, RETURN, START];
/// What opens a header, between messages.
const HEADER_OPENS: [&str; 2] = [START, CHANNEL];
/// A header longer than this is no header: its text is content.
const MAX_HEADER: usize = 256;

/// Where a harmony parser is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum At {
    /// Before the first message.
    First,
    /// Between messages.
    Between,
    /// In a header, up to `<|message|>`.
    Header,
    /// In a body.
    Body(Body),
}

/// What a message's body is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Body {
    Reasoning,
    Content,
    /// A call of `name`; `header` as written (its text is content if the
    /// arguments do not parse).
    Call {
        name: String,
        header: String,
    },
}

/// `text` up to the first whitespace or `<`.
fn word(text: &str) -> &str {
    let end = text
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(text.len());
    &text[..end]
}

/// The channel and the recipient a header names.
fn read_header(header: &str) -> (&str, Option<&str>) {
    let channel = header
        .find(CHANNEL)
        .map_or("", |at| word(&header[at + CHANNEL.len()..]));
    let recipient = header.find("to=").map(|at| word(&header[at + 3..]));
    (channel, recipient)
}

impl OutputParser {
    pub(super) fn step_harmony(&mut self, out: &mut Vec<Piece>, at: At, end: bool) -> bool {
        match at {
            At::First => self.harmony_between(out, true, end),
            At::Between => self.harmony_between(out, false, end),
            At::Header => self.harmony_header(out, end),
            At::Body(body) => self.harmony_body(out, body, end),
        }
    }

    fn harmony_between(&mut self, out: &mut Vec<Piece>, first: bool, end: bool) -> bool {
        let trimmed = self.buffer.trim_start();
        if trimmed.is_empty() {
            if end {
                self.buffer.clear();
            }
            return false;
        }
        // The first message's header may begin with its recipient (the
        // prompt ended with `<|start|>assistant`).
        let opens: &[&str] = if first {
            &[START, CHANNEL, "to="]
        } else {
            &HEADER_OPENS
        };
        if opens.iter().any(|open| trimmed.starts_with(open)) {
            let skip = self.buffer.len() - trimmed.len();
            self.take(skip);
            self.state = State::Harmony(At::Header);
            return true;
        }
        if !end && opens.iter().any(|open| open.starts_with(trimmed)) {
            return false;
        }
        // Text outside any message (a model that does not write harmony) is
        // content, up to where a header opens.
        self.state = State::Harmony(At::Between);
        if let Some((at, _)) = scan::find_first(&self.buffer, &HEADER_OPENS) {
            let text = self.take(at);
            Self::content(out, text);
            return true;
        }
        let hold = if end {
            0
        } else {
            scan::partial_suffix(&self.buffer, &HEADER_OPENS)
        };
        let text = self.take(self.buffer.len() - hold);
        Self::content(out, text);
        false
    }

    /// A header is decided on its first `MAX_HEADER` bytes (and room for
    /// `<|message|>`) alone, however the text arrives in pieces.
    fn harmony_header(&mut self, out: &mut Vec<Piece>, end: bool) -> bool {
        let full = self.buffer.len() >= MAX_HEADER + MESSAGE.len();
        let mut cap = (MAX_HEADER + MESSAGE.len()).min(self.buffer.len());
        while !self.buffer.is_char_boundary(cap) {
            cap -= 1;
        }
        let window = &self.buffer[..cap];
        let message = window.find(MESSAGE);
        let stop = scan::find_first(window, &[END, CALL, RETURN]);
        let broken = match (message, stop) {
            (Some(at), stop) if stop.is_none_or(|(p, _)| at < p) => None,
            // An end before any `<|message|>`: never a message.
            (_, Some((p, marker))) => Some(p + marker.len()),
            // No `<|message|>` within reach: never a message.
            _ if full || end => Some(cap),
            _ => return false,
        };
        if let Some(len) = broken {
            let text = self.take(len);
            Self::content(out, text);
            self.state = State::Harmony(At::Between);
            return true;
        }
        let at = message.unwrap_or_default();
        let header = self.take(at);
        self.take(MESSAGE.len());
        let (channel, recipient) = read_header(&header);
        let body = match recipient {
            Some(to) => match to.strip_prefix("functions.") {
                Some(name) if self.format.is_some() && !name.is_empty() => Body::Call {
                    name: name.to_owned(),
                    header,
                },
                // A recipient we serve no call for: the message is text.
                _ => {
                    Self::content(out, format!("{header}{MESSAGE}"));
                    Body::Content
                }
            },
            None if channel == "analysis" => Body::Reasoning,
            None => Body::Content,
        };
        self.state = State::Harmony(At::Body(body));
        true
    }

    fn harmony_body(&mut self, out: &mut Vec<Piece>, body: Body, end: bool) -> bool {
        let found = scan::find_first(&self.buffer, &BODY_ENDS);
        if let Body::Call { name, header } = &body {
            let Some((at, marker)) = found.or(end.then_some((self.buffer.len(), ""))) else {
                return false;
            };
            let text = self.take(at);
            if marker != START {
                self.take(marker.len());
            }
            match serde_json::from_str::<Value>(text.trim()) {
                Ok(arguments @ Value::Object(_)) => {
                    let index = self.calls;
                    self.calls += 1;
                    out.push(Piece::CallStart {
                        index,
                        name: name.clone(),
                    });
                    out.push(Piece::CallArguments {
                        index,
                        json: arguments.to_string(),
                    });
                    out.push(Piece::CallEnd { index });
                }
                _ => Self::content(out, format!("{header}{MESSAGE}{text}")),
            }
            self.state = State::Harmony(At::Between);
            return true;
        }
        let (text, done) = match found {
            Some((at, marker)) => {
                let text = self.take(at);
                if marker != START {
                    self.take(marker.len());
                }
                (text, true)
            }
            None => {
                let hold = if end {
                    0
                } else {
                    scan::partial_suffix(&self.buffer, &BODY_ENDS)
                };
                (self.take(self.buffer.len() - hold), false)
            }
        };
        match body {
            Body::Reasoning => self.reasoning_text(out, text),
            _ => Self::content(out, text),
        }
        if done {
            self.state = State::Harmony(At::Between);
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_name_their_channel_and_recipient() {
        assert_eq!(read_header("<|channel|>analysis"), ("analysis", None));
        assert_eq!(
            read_header("<|channel|>commentary to=functions.get_weather <|constrain|>json"),
            ("commentary", Some("functions.get_weather"))
        );
        assert_eq!(
            read_header(" to=functions.f<|channel|>commentary json"),
            ("commentary", Some("functions.f"))
        );
        assert_eq!(read_header("assistant<|channel|>final"), ("final", None));
    }
}
