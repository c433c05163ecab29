//! What can be wrong with a request's tools, choice or grammar composition.

/// An error in the tools or tool choice a request declares; each names the
/// tool or field at fault.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AgentError {
    /// A tool's name is empty or uses characters other than ASCII letters,
    /// digits, `_`, `-` and `.` (OpenAI's rule, and what call grammars can
    /// spell).
    #[error("tools[{index}].name {name:?}: a tool name is 1 to 64 ASCII letters, digits, '_', '-' or '.'")]
    BadToolName {
        /// The tool's position in the request.
        index: usize,
        /// The name as given.
        name: String,
    },
    /// Two tools share a name.
    #[error("tools[{index}].name {name:?}: another tool already has this name")]
    DuplicateTool {
        /// The later tool's position.
        index: usize,
        /// The shared name.
        name: String,
    },
    /// A tool's `parameters` is not a JSON schema object.
    #[error("tools[{index}] ({name}).parameters: {message}")]
    BadParameters {
        /// The tool's position.
        index: usize,
        /// The tool's name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// `tool_choice` names a function that is not among the tools.
    #[error("tool_choice names the function {name:?}, which is not among the tools ({known})")]
    UnknownTool {
        /// The name asked for.
        name: String,
        /// The tools' names, comma-separated ("none" when there are none).
        known: String,
    },
    /// `tool_choice` asks for a call but no tools were given.
    #[error("tool_choice {choice:?} needs at least one tool")]
    NoTools {
        /// The choice as the API spells it.
        choice: &'static str,
    },
    /// A response format that cannot be combined with tools or reasoning.
    #[error("response_format: a {kind} cannot be combined with {with}; use a JSON schema")]
    Uncombinable {
        /// The response format's kind.
        kind: String,
        /// What it would have been combined with.
        with: &'static str,
    },
}
