//! Stop strings over streamed text: text is released only once it can no
//! longer be the start of a stop string.

/// Matches stop strings in streamed text.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    /// The stop string found, once one was.
    matched: Option<usize>,
}

impl StopMatcher {
    /// A matcher for these stop strings (empty strings are ignored).
    pub fn new(stops: impl IntoIterator<Item = String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            matched: None,
        }
    }

    /// The stop string that ended the text, once [`StopMatcher::push`]
    /// found one (the earliest in the text; the first listed on a tie).
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Feeds newly decoded text; returns the text safe to emit and whether a
    /// stop string was found (the stop string and what follows are dropped).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        if let Some((at, which)) = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((self.held.find(s.as_str())?, i)))
            .min()
        {
            self.matched = Some(which);
            let out = self.held[..at].to_owned();
            self.held.clear();
            return (out, true);
        }
        // Hold back the longest suffix that is a prefix of some stop string.
        let mut keep = 0;
        for stop in &self.stops {
            for len in (1..stop.len()).rev() {
                if len <= self.held.len()
                    && stop.is_char_boundary(len)
                    && self.held.ends_with(&stop[..len])
                {
                    keep = keep.max(len);
                    break;
                }
            }
        }
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_owned();
        self.held.drain(..cut);
        (out, false)
    }

    /// Releases held text at the end of the request.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_across_pieces_and_held_prefixes() {
        let mut m = StopMatcher::new(["</end>".to_owned(), "STOP".to_owned()]);
        assert_eq!(m.push("hello </"), ("hello ".to_owned(), false));
        assert_eq!(m.push("en"), (String::new(), false));
        assert_eq!(m.matched(), None);
        assert_eq!(m.push("d> tail"), (String::new(), true));
        assert_eq!(m.matched(), Some("</end>"));
        let mut m = StopMatcher::new(["STOP".to_owned()]);
        assert_eq!(m.push("ST"), (String::new(), false));
        assert_eq!(m.push("ART"), ("START".to_owned(), false));
        assert_eq!(m.push("S"), (String::new(), false));
        assert_eq!(m.finish(), "S");
    }
}
