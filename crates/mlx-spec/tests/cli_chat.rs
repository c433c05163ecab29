//! `mlx-spec chat` as a user runs it: lines on standard input, each answer
//! on standard output after a `>> ` prompt.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

/// The tiny llama's template: a turn is its role's word and its text; the
/// answer follows `w2`.
const TEMPLATE: &str = "{% for m in messages %}{% if m.role == 'user' %}w1 {% elif m.role == 'system' %}w3 {% else %}w2 {% endif %}{{ m.content }} {% endfor %}{% if add_generation_prompt %}w2{% endif %}";

/// Starts `mlx-spec chat ARGS`, its standard input and output piped,
/// standard error to `stderr`.
fn spawn(args: &[&str], stderr: Stdio) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_mlx-spec"))
        .arg("chat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("start mlx-spec chat")
}

/// Runs `mlx-spec chat ARGS` with `input` on standard input: success,
/// stdout, stderr.
fn chat(args: &[&str], input: &str) -> (bool, String, String) {
    let mut child = spawn(args, Stdio::piped());
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write the lines");
    let out = child.wait_with_output().expect("run mlx-spec chat");
    (
        out.status.success(),
        common::text(&out.stdout),
        common::text(&out.stderr),
    )
}

/// What follows each `>> ` prompt: the answer's line and, with
/// `--verbose`, its stats line (empty for a command without output).
fn turns(stdout: &str) -> Vec<Vec<String>> {
    stdout
        .split(">> ")
        .skip(1)
        .map(|turn| turn.lines().map(str::to_owned).collect())
        .collect()
}

/// The number `(+N cached)` of a stats line names, 0 without one.
fn cached(stats: &str) -> usize {
    stats
        .split_once("(+")
        .and_then(|(_, rest)| rest.split_once(' '))
        .map_or(0, |(n, _)| n.parse().expect("a count"))
}

#[test]
fn each_turn_answers_the_whole_conversation_from_the_cache_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::tiny_llama_with_template(dir.path(), TEMPLATE);
    let model = dir.path().to_str().expect("utf-8");
    // Two turns, the help, a reset, the first turn again; nothing after `q`.
    let input = "w4 w5 w6\nw7 w8\nh\n\nr\nw4 w5 w6\nq\nw9\n";
    let run = |extra: &[&str]| {
        let mut args = vec!["--model", model, "--max-tokens", "8", "--verbose"];
        args.extend_from_slice(extra);
        let (ok, stdout, stderr) = chat(&args, input);
        assert!(ok, "{stderr}");
        assert!(
            stdout.starts_with("[INFO] Starting chat session with "),
            "{stdout}"
        );
        let turns = turns(&stdout);
        // Two answers, the help, the empty line and the reset, an answer.
        assert_eq!(turns.len(), 7, "{stdout}");
        assert!(
            turns[2].join("\n").contains("'r' to reset the chat"),
            "{stdout}"
        );
        assert!(turns[3].is_empty() && turns[4].is_empty(), "{stdout}");
        assert!(turns[6].is_empty(), "`q` ends the chat: {stdout}");
        [&turns[0], &turns[1], &turns[5]].map(|t| {
            assert_eq!(t.len(), 2, "an answer and its stats: {stdout}");
            (t[0].clone(), t[1].clone())
        })
    };
    let plain = run(&[]);
    let [(first, stats1), (second, stats2), (again, stats3)] = &plain;
    assert_eq!(first.split_whitespace().count(), 8, "{first}");
    assert_eq!(first, again, "a reset starts the conversation over");
    assert_ne!(first, second, "the second turn sees its own message");
    // The first turn prefills its 5 tokens; the second starts from the
    // first's prompt and answer (all but the answer's last token, which
    // the cache never computed), the repeated first turn from its prompt.
    assert!(stats1.starts_with("Prompt: 5 tokens, "), "{stats1}");
    assert_eq!(cached(stats1), 0, "{stats1}");
    assert!(cached(stats2) >= 5 + 8 - 1, "{stats2}");
    assert_eq!(cached(stats3), 4, "{stats3}");
    // Every turn prefilled whole gives the same answers: the cache never
    // changes one; neither does speculation.
    let cold = run(&["--prompt-cache-bytes", "0"]);
    for runs in [
        cold.clone(),
        run(&["--draft", "prompt-lookup", "--num-draft", "4"]),
        run(&["--draft", "suffix"]),
    ] {
        let answers: Vec<&String> = runs.iter().map(|(a, _)| a).collect();
        assert_eq!(answers, [first, second, again]);
    }
    assert!(cold.iter().all(|(_, stats)| cached(stats) == 0), "{cold:?}");
    let drafted = run(&["--draft", "suffix"]);
    assert!(
        drafted[1].1.contains("Draft suffix: acceptance"),
        "{drafted:?}"
    );

    // A system message opens the conversation, from a file too.
    let with_system = |system: &str| {
        let args = [
            "--model",
            model,
            "-m",
            "4",
            "--verbose",
            "--system-prompt",
            system,
        ];
        let (ok, stdout, stderr) = chat(&args, "w4\n");
        assert!(ok, "{stderr}");
        stdout
    };
    let stdout = with_system("w9 w10");
    assert!(
        turns(&stdout)[0][1].starts_with("Prompt: 6 tokens, "),
        "{stdout}"
    );
    let file = dir.path().join("system.txt");
    std::fs::write(&file, "w9 w10\n").expect("write");
    let from_file = with_system(file.to_str().expect("utf-8"));
    assert!(
        from_file.contains("System prompt loaded from"),
        "{from_file}"
    );
    assert_eq!(turns(&from_file)[0][0], turns(&stdout)[0][0]);
}

/// `"""` opens and closes a message of several lines: one turn, whose text
/// holds the lines (the word tokenizer reads a newline as a space).
#[test]
fn a_message_of_several_lines_is_one_turn() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::tiny_llama_with_template(dir.path(), TEMPLATE);
    let model = dir.path().to_str().expect("utf-8");
    let args = ["--model", model, "-m", "6", "--verbose"];
    let (ok, lines, stderr) = chat(&args, "\"\"\"w4 w5\nw6\nw7\"\"\"\n\"\"\"w8\"\"\"\n");
    assert!(ok, "{stderr}");
    assert_eq!(lines.matches("... ").count(), 2, "{lines}");
    let (ok, one, stderr) = chat(&args, "w4 w5 w6 w7\nw8\n");
    assert!(ok, "{stderr}");
    // Each answer's line after the continuation prompts, and its stats'
    // prompt count.
    let answers = |out: &str| -> Vec<(String, String)> {
        turns(out)
            .into_iter()
            .take(2)
            .map(|t| {
                let prompt = t[1].split(',').next().unwrap_or_default().to_owned();
                (t[0].trim_start_matches("... ").to_owned(), prompt)
            })
            .collect()
    };
    assert_eq!(answers(&lines), answers(&one));
    assert_eq!(answers(&one)[1].1, "Prompt: 4 tokens (+11 cached)", "{one}");
}

#[test]
fn bad_input_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::tiny_llama_with_template(dir.path(), TEMPLATE);
    let model = dir.path().to_str().expect("utf-8");
    let (ok, _, stderr) = chat(&["--model", model, "--draft", "no-such"], "w4\n");
    assert!(!ok && stderr.contains("no-such"), "{stderr}");
    let (ok, _, stderr) = chat(&["--model", model, "--num-draft", "0"], "");
    assert!(!ok && stderr.contains("--num-draft"), "{stderr}");
    let (ok, _, stderr) = chat(&["--model", model, "--system-prompt", "./missing.txt"], "");
    assert!(!ok && stderr.contains("missing.txt"), "{stderr}");
    let (ok, _, stderr) = chat(&["--model", model, "--chat-template-config", "[1]"], "");
    assert!(!ok && stderr.contains("--chat-template-config"), "{stderr}");
    // A model without a template has no conversation to render.
    let bare = tempfile::tempdir().expect("tempdir");
    spec_fixtures::llama::Llama::tiny(7)
        .write(bare.path())
        .expect("checkpoint");
    common::write_tokenizer(bare.path(), 96);
    let (ok, _, stderr) = chat(&["--model", bare.path().to_str().expect("utf-8")], "w4\n");
    assert!(!ok && stderr.contains("chat template"), "{stderr}");
}

/// The real model answers from the conversation: a question after a turn
/// that told it the answer is answered otherwise than the same question
/// alone; its byte-level BPE tokens of each answer re-encoded in the next
/// turn's prompt still start from the cache; the cache and speculation
/// (the suffix tree drafting from the earlier answers) keep every answer.
#[test]
fn the_default_model_answers_from_the_conversation_exactly() {
    let input = "My favourite colour is blue.\nWhat is my favourite colour?\nr\nWhat is my favourite colour?\n";
    let run = |extra: &[&str]| {
        let mut args = vec!["--max-tokens", "30", "--verbose"];
        args.extend_from_slice(extra);
        let (ok, stdout, stderr) = chat(&args, input);
        assert!(ok, "{stderr}");
        turns(&stdout)
    };
    let plain = run(&[]);
    let answer = |turns: &[Vec<String>], i: usize| turns[i][0].clone();
    assert_ne!(answer(&plain, 1), answer(&plain, 3), "{plain:?}");
    let first_prompt: usize = plain[0][1]
        .strip_prefix("Prompt: ")
        .and_then(|rest| rest.split_once(' '))
        .map(|(n, _)| n.parse().expect("a count"))
        .expect("the stats line");
    assert!(cached(&plain[1][1]) >= first_prompt, "{plain:?}");
    for other in [
        run(&["--prompt-cache-bytes", "0"]),
        run(&["--draft", "suffix"]),
    ] {
        for i in [0, 1, 3] {
            assert_eq!(answer(&other, i), answer(&plain, i));
        }
    }
}

/// A chat running in the background, its standard output read as it comes.
struct Live {
    child: std::process::Child,
    chunks: std::sync::mpsc::Receiver<String>,
    seen: String,
}

impl Live {
    fn start(args: &[&str]) -> Live {
        let mut child = spawn(args, Stdio::null());
        let mut stdout = child.stdout.take().expect("stdout");
        let (tx, chunks) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n @ 1..) = std::io::Read::read(&mut stdout, &mut buffer) {
                if tx.send(common::text(&buffer[..n])).is_err() {
                    return;
                }
            }
        });
        Live {
            child,
            chunks,
            seen: String::new(),
        }
    }

    fn send(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(line.as_bytes()).expect("write a line");
        stdin.flush().expect("flush");
    }

    /// Reads until `done` holds of what the chat has printed (at most two
    /// minutes).
    fn wait_for(&mut self, what: &str, done: impl Fn(&str) -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while !done(&self.seen) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.chunks.recv_timeout(left) {
                Ok(chunk) => self.seen.push_str(&chunk),
                Err(_) => panic!("no {what} in: {}", self.seen),
            }
        }
    }

    /// Ctrl-C, as the terminal sends it.
    fn interrupt(&self) {
        let status = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }
}

/// Ctrl-C stops the answer running (the next turn starts from the
/// conversation with the answer as far as it went), and at the prompt
/// ends the chat with the shell's status for it.
#[test]
fn ctrl_c_stops_an_answer_and_at_the_prompt_ends_the_chat() {
    let mut chat = Live::start(&["--max-tokens", "1000", "--verbose"]);
    let prompts = |s: &str| s.matches(">> ").count();
    // An answer under way: some text after the first prompt.
    let answering = |n: usize| {
        move |s: &str| prompts(s) == n && s.rsplit(">> ").next().is_some_and(|t| t.len() > 20)
    };
    for (turn, question) in [
        "Count from 1 to 400, one number per line.\n",
        "Now count backwards.\n",
    ]
    .into_iter()
    .enumerate()
    {
        chat.wait_for("prompt", |s| prompts(s) == turn + 1);
        chat.send(question);
        chat.wait_for("answer", answering(turn + 1));
        chat.interrupt();
        chat.wait_for("stats line", |s| {
            s.matches("Generation: ").count() == turn + 1
        });
    }
    chat.wait_for("prompt", |s| prompts(s) == 3);
    let stats: Vec<&str> = chat
        .seen
        .lines()
        .filter(|l| l.starts_with("Prompt: "))
        .collect();
    let generated = |line: &str| -> usize {
        let (_, rest) = line.split_once("Generation: ").expect("generation");
        rest.split(' ')
            .next()
            .expect("count")
            .parse()
            .expect("a number")
    };
    assert!(stats.iter().all(|l| generated(l) < 1000), "{stats:?}");
    // The second turn's prompt holds the first, stopped answer: it starts
    // from the caches past the first turn's prompt.
    let first_prompt: usize = stats[0]
        .strip_prefix("Prompt: ")
        .and_then(|rest| rest.split_once(' '))
        .map(|(n, _)| n.parse().expect("a count"))
        .expect("the stats line");
    assert!(cached(stats[1]) > first_prompt, "{stats:?}");
    chat.interrupt();
    // Standard input stays open (`Child::wait` would close it first, and
    // the chat could end on the end of its input before the signal).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = chat.child.try_wait().expect("the chat's status") {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the chat did not end: {}",
            chat.seen
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(130), "{}", chat.seen);
}
