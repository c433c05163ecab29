"""Gate `gguf`'s converter check: llama.cpp's own `convert_hf_to_gguf.py`
(vendored in the llama-cpp-python sdist, at `--llama-cpp`) writes a float32
GGUF file of each synthetic checkpoint given, as `OUT/NAME.gguf`.

The synthetic checkpoints carry no tokenizer files, which the converter
reads for the vocabulary: its vocabulary step is replaced by one writing
placeholder tokens (the check is about tensors and hyperparameters; llama.cpp's
tokenizers are checked by the vocabulary tests). Everything else is the
converter's own code. Runs in the reference environment (torch).
"""

import argparse
import logging
import os
import runpy
import sys
from pathlib import Path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("models", nargs="+", type=Path)
    args = ap.parse_args()
    # Quiet: the converter logs every tensor at INFO (its own basicConfig is
    # a no-op once this one ran) and draws a progress bar per file.
    logging.basicConfig(level=logging.WARNING)
    os.environ["TQDM_DISABLE"] = "1"
    src = args.llama_cpp
    sys.path.insert(0, str(src))
    sys.path.insert(1, str(src / "gguf-py"))

    from conversion import base

    def placeholder_vocab(self):
        n = self.hparams["vocab_size"]
        self.gguf_writer.add_tokenizer_model("gpt2")
        self.gguf_writer.add_tokenizer_pre("default")
        self.gguf_writer.add_token_list([f"<{i}>" for i in range(n)])
        self.gguf_writer.add_token_types([1] * n)

    # Every model class the checkpoints map to defines or inherits
    # `set_vocab`; replace it wherever it is defined.
    def patch(cls):
        if "set_vocab" in vars(cls):
            cls.set_vocab = placeholder_vocab
        for sub in cls.__subclasses__():
            patch(sub)

    import conversion  # noqa: F401  (registers every model class)
    for module in ("llama", "qwen"):
        __import__(f"conversion.{module}")
    patch(base.ModelBase)

    args.out.mkdir(parents=True, exist_ok=True)
    script = str(src / "convert_hf_to_gguf.py")
    for model in args.models:
        out = args.out / f"{model.name}.gguf"
        sys.argv = [script, str(model), "--outtype", "f32", "--outfile", str(out)]
        runpy.run_path(script, run_name="__main__")
        if not out.is_file():
            sys.exit(f"the converter wrote no {out}")


if __name__ == "__main__":
    main()
