"""The `rag` command through typer's CliRunner, on the real parts."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rag import Pipeline, cli

from .conftest import assert_clean_error
from rag.errors import EngineMisconfigured
from rag.settings import Settings

README = Path(__file__).resolve().parent.parent / "README.md"


def test_ingest_then_reingest_prints_counts(run, corpus, tmp_path):
    index = tmp_path / "index"
    first = run("ingest", corpus, "--index", index)
    assert first.exit_code == 0, first.output
    assert "added 4, updated 0, removed 0, skipped 0, failed 0" in first.stderr
    second = run("ingest", corpus, "--index", index, "--json")
    assert second.exit_code == 0
    assert json.loads(second.stdout)["skipped"] == 4


def test_ingest_reports_bad_files_and_exits_nonzero(run, corpus, tmp_path):
    (corpus / "latin1.txt").write_bytes("na\xefve".encode("latin-1"))
    (corpus / "empty.md").write_text("")
    result = run("ingest", corpus, "--index", tmp_path / "index")
    assert result.exit_code == 1
    assert "added 4" in result.stderr and "failed 2" in result.stderr
    assert re.search(r"failed: latin1.txt: not UTF-8", result.stderr)
    assert re.search(r"failed: empty.md: no text", result.stderr)
    assert "Traceback" not in result.output
    assert run("search", "bread", "--index", tmp_path / "index").exit_code == 0


def test_collections_are_created_listed_and_deleted(run, corpus, tmp_path):
    index = tmp_path / "index"
    made = run("collections", "create", "legal", "--index", index)  # before any ingest: the index is made with it
    assert made.exit_code == 0 and "created the collection legal" in made.stderr, made.output
    assert "exists already" in run("collections", "create", "legal", "--index", index).stderr
    alone = run("search", "bread", "--index", index, "--collection", "legal")  # the index's one collection, empty
    assert alone.exit_code == 1 and "'legal' holds no documents" in alone.stderr, alone.output
    assert run("ingest", corpus, "--index", index).exit_code == 0
    listed = run("collections", "list", "--index", index, "--json")
    assert json.loads(listed.stdout)["collections"] == [{"name": "default", "documents": 4},
                                                         {"name": "legal", "documents": 0}]
    empty = run("search", "bread", "--index", index, "--collection", "legal")
    assert empty.exit_code == 1 and "'legal' holds no documents" in empty.stderr, empty.output
    assert "deleted the collection legal: 0 documents" in run("collections", "delete", "legal", "--index", index).stderr
    gone = run("collections", "delete", "legal", "--index", index)
    assert gone.exit_code == 1 and "no collection 'legal'" in gone.stderr and "Traceback" not in gone.output
    bad = run("collections", "create", "no/slash", "--index", index)
    assert bad.exit_code != 0 and "Traceback" not in bad.output


def test_search_json_contract(run, corpus, tmp_path):
    index = tmp_path / "index"
    run("ingest", corpus, "--index", index)
    result = run("search", "tomatoes need sun", "--index", index, "-k", "2", "--json")
    assert result.exit_code == 0, result.output
    results = json.loads(result.stdout)["results"]
    assert len(results) == 2 and results[0]["source"] == "guide/garden.html"
    for r in results:
        assert {"chunk_id", "source", "score", "text"} <= set(r)
        assert isinstance(r["score"], float) and isinstance(r["chunk_id"], str)


def test_ask_json_contract_through_the_cli(run, corpus, tmp_path):
    index = tmp_path / "index"
    run("ingest", corpus, "--index", index)
    result = run("ask", "What is prefill?", "--index", index, "--max-tokens", "12", "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["sources"] and d["budget"]["chosen"] == len(d["sources"])
    t = d["timings"]
    assert t["cached_tokens"] + t["prefill_tokens"] == t["prompt_tokens"]


def test_ask_streams_the_answer_then_lists_sources(run, corpus, tmp_path):
    index = tmp_path / "index"
    run("ingest", corpus, "--index", index)
    result = run("ask", "What limits decode?", "--index", index, "--max-tokens", "16", "-k", "2", "--explain")
    assert result.exit_code == 0, result.output
    answer, _, sources = result.stdout.partition("Sources")
    # The passages' order follows the KV the passage store holds (a held one leads, to be reused
    # exactly), which earlier commands may have left: decode.txt is shown and is the evidence's passage.
    assert answer.strip() and "decode.txt" in sources
    number = re.search(r"\[(\d+)\] decode\.txt", sources).group(1)
    assert f"Evidence [{number}] decode.txt" in answer
    assert "budget decision" in sources and "measured" in sources


@pytest.mark.parametrize(
    "args, fragments",
    [
        (("search", "x", "--index", "{tmp}/missing"), ("no index at", "rag ingest")),
        (("ask", "x", "--index", "{tmp}/missing"), ("no index at",)),
        (("ask", "x", "--model", "{tmp}/none.gguf"), ("no such model file",)),
        (("ask", "x", "--model", "{corpus}/prefill.md"), ("not a GGUF",)),
        (("ingest", "{tmp}/does-not-exist", "--index", "{tmp}/i"), ()),
        (("ingest", "{corpus}", "--index", "{tmp}/i", "--chunk-tokens", "4"), ("too small",)),
        (("search", "   "), ("query is empty",)),
    ],
)
def test_bad_input_is_one_line_and_nonzero(run, corpus, tmp_path, args, fragments):
    args = [a.format(tmp=tmp_path, corpus=corpus) for a in args]
    result = run(*args)
    if args[0] == "ingest" and not fragments:
        assert result.exit_code == 1 and "no such file or folder" in result.stderr
        assert "Traceback" not in result.output
    else:
        assert_clean_error(result, *fragments)


def test_question_longer_than_context_is_a_clean_error(run, corpus, tmp_path):
    index = tmp_path / "index"
    run("ingest", corpus, "--index", index)
    assert_clean_error(run("ask", "why " * 3000, "--index", index), "question is too long")


def test_index_from_another_version_is_refused(run, corpus, tmp_path):
    index = tmp_path / "index"
    run("ingest", corpus, "--index", index)
    manifest = next(index.glob("gen-*/manifest.json"))
    raw = json.loads(manifest.read_text())
    raw["format_version"] = 99
    manifest.write_text(json.dumps(raw))
    assert_clean_error(run("search", "bread", "--index", index), "format version 99", "rag ingest --rebuild")
    assert_clean_error(run("ingest", corpus, "--index", index), "format version 99")
    # The advice works: a rebuild from the documents replaces the old index.
    rebuilt = run("ingest", "--rebuild", corpus, "--index", index)
    assert rebuilt.exit_code == 0, rebuilt.output
    assert run("search", "bread", "--index", index).exit_code == 0


def test_doctor_reports_engine_and_index(run, corpus, tmp_path):
    index = tmp_path / "index"
    run("ingest", corpus, "--index", index)
    result = run("doctor", "--index", index, "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["versions"]["llama-cpp-python"] and d["engine"]["build"] and d["engine"]["n_threads"] >= 1
    assert d["index"]["files"] == 4 and d["index"]["chunks"] >= 4
    assert d["index"]["vector_search"].startswith("exact") and d["index"]["lexical"] is True
    assert d["retrieval"] == "hybrid"
    # What llama.cpp was built with, and whether extra buffer types are on and why (the self-check's verdict).
    from engine.llama_cpp.selfcheck import built_features

    assert d["engine"]["built_cpu_features"].split() == built_features(d["engine"]["system_info"]) != []
    assert isinstance(d["engine"]["extra_buffer_types"], bool) and "check" in d["engine"]["extra_buffer_types_why"]
    text = run("doctor", "--index", index)
    assert "model_path" in text.stdout and "index.chunks" in text.stdout and "index.vector_search" in text.stdout
    assert "extra_buffer_types_why" in text.stdout and "built_cpu_features" in text.stdout


def _quick_start_commands() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(?:sh|bash|console)?\n(.*?)```", section, re.S)
    return [line for block in blocks for line in block.strip().splitlines() if line.strip()]


def test_readme_quick_start_is_two_commands_and_its_question_is_answered(run):
    commands = _quick_start_commands()
    assert len(commands) == 2
    ask = shlex.split(commands[0].rsplit("&&", 1)[1])
    assert ask[:2] == ["rag", "ask"]
    assert "pytest" in commands[1] and "[test]" in commands[1]
    result = run(*ask[1:], "--max-tokens", "24")
    assert result.exit_code == 0, result.output
    assert "Sources" in result.stdout and ".md" in result.stdout.partition("Sources")[2]


def test_ci_runs_the_readme_test_command():
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert _quick_start_commands()[1] in ci
    assert "-eq 5" in ci  # pytest's "no tests collected" fails CI


def test_calibrate_prints_the_table_the_fits_and_their_error(run):
    result = run("calibrate", "--quick")
    assert result.exit_code == 0, result.output
    assert "measured prefill" in result.stdout and "MAPE" in result.stdout and "(kept)" in result.stdout


def test_bench_ttft_json_follows_the_bench_convention(run, corpus, tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text(
        '{"question": "What limits decode?", "gold": ["decode.txt"]}\n'
        '{"question": "How long does bread rise?", "gold": ["guide/cooking.rst"]}\n'
    )
    result = run("bench", "ttft", "--corpus", corpus, "--questions", questions, "--targets", "0.4,3",
                 "--index", tmp_path / "index", "--max-tokens", "2", "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["bench"] == "ttft" and d["config"]["targets"] == [0.4, 3.0] and len(d["rows"]) == 4
    keys = {"target_s", "feasible", "requests", "p50_ratio", "p95_ratio", "over_share", "mean_chunks",
            "mean_prompt_tokens", "pred_err_p50", "pred_err_p95"}
    assert [t["target_s"] for t in d["summary"]["targets"]] == [0.4, 3.0]
    assert all(keys <= set(t) for t in d["summary"]["targets"])
    bad = run("bench", "ttft", "--corpus", corpus, "--questions", questions, "--targets", "fast")
    assert_clean_error(bad, "--targets")


def test_ask_with_a_session_continues_the_conversation(run, corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("RAG_CONVERSATIONS", str(tmp_path / "conversations.sqlite"))
    index = tmp_path / "index"
    assert run("ingest", corpus, "--index", index).exit_code == 0
    first = run("ask", "What does prefill do?", "--index", index, "--session", "cli-1", "--max-tokens", "12", "--json")
    assert first.exit_code == 0, first.output
    second = run("ask", "And decode?", "--index", index, "--session", "cli-1", "--max-tokens", "12", "--json")
    one, two = json.loads(first.stdout), json.loads(second.stdout)
    assert (one["turn"], two["turn"]) == (1, 2) and two["turns_shown"] == 1 and two["session"] == "cli-1"
    assert two["timings"]["prompt_tokens"] > one["timings"]["prompt_tokens"]
    bad = run("ask", "x", "--index", index, "--session", "no spaces please")
    assert_clean_error(bad, "session id")


def test_chat_streams_answers_and_runs_its_commands(run, corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("RAG_CONVERSATIONS", str(tmp_path / "conversations.sqlite"))
    index = tmp_path / "index"
    assert run("ingest", corpus, "--index", index).exit_code == 0
    runner = CliRunner()
    script = "How long should dough rise?\nAnd at what temperature?\n/sources\n/stats\n/nope\n/reset\n/quit\n"
    result = runner.invoke(cli.app, ["chat", "--index", str(index), "--session", "chat-1", "--max-tokens", "12"], input=script)
    assert result.exit_code == 0, result.output
    assert "guide/cooking.rst" in result.stdout  # /sources
    assert "cached/prompt tokens" in result.stdout and "prefilled" in result.stdout  # /stats
    assert "unknown command /nope" in result.stderr
    assert "session chat-1 forgotten" in result.stderr
    resumed = runner.invoke(cli.app, ["chat", "--index", str(index), "--session", "chat-1"], input="/quit\n")
    assert "resuming" not in resumed.stderr  # /reset forgot it


def test_serve_refuses_an_exposed_address_without_keys(run, monkeypatch):
    monkeypatch.delenv("RAG_SERVE_API_KEYS", raising=False)
    assert_clean_error(run("serve", "--host", "0.0.0.0"), "API keys")
    assert_clean_error(run("serve", "--port", "70000"), "port")


def _questions_file(tmp_path: Path) -> Path:
    questions = tmp_path / "q.jsonl"
    questions.write_text(
        '{"question": "What limits decode?", "gold": ["decode.txt"]}\n'
        '{"question": "At how many degrees is bread baked?", "gold": ["guide/cooking.rst"]}\n'
    )
    return questions


def test_bench_retrieval_reports_recall_and_mrr_for_every_mode(run, corpus, tmp_path):
    result = run("bench", "retrieval", "--corpus", corpus, "--questions", _questions_file(tmp_path),
                 "--k", "1,3", "--index", tmp_path / "index", "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["bench"] == "retrieval" and len(d["rows"]) == 2 * len(d["summary"]["systems"])
    summary = d["summary"]
    assert {"recall@1", "recall@3", "mrr"} <= set(summary)
    names = [s["name"] for s in summary["systems"]]
    assert names[:2] == ["dense", "bm25"] and any(n.startswith("hybrid") for n in names)
    assert summary["default"] in names
    for s in summary["systems"]:
        assert 0 <= s["recall@1"] <= s["recall@3"] <= 1 and 0 <= s["mrr"] <= 1
    # On two easy questions over four documents every mode finds both.
    assert summary["recall@3"] == 1.0
    table = run("bench", "retrieval", "--corpus", corpus, "--questions", _questions_file(tmp_path),
                "--index", tmp_path / "index")
    assert table.exit_code == 0 and f"default retrieval: {summary['default']}" in table.stdout
    assert_clean_error(run("bench", "retrieval", "--corpus", corpus, "--questions", _questions_file(tmp_path),
                            "--k", "0"), "--k")


def test_bench_peer_runs_langchain_beside_rag_budget(run, corpus, tmp_path):
    pytest.importorskip("langchain_community", reason="the bench extra is not installed")
    result = run("bench", "peer", "--corpus", corpus, "--include", "*", "--questions", _questions_file(tmp_path),
                 "--limit", "1", "--k", "1,20", "--max-tokens", "2", "--index", tmp_path / "index", "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    systems = d["summary"]["systems"]
    assert [s["name"] for s in systems] == ["rag-budget", "langchain k=1", "langchain k=20"]
    keys = {"name", "median_ttft_s", "p95_ttft_s", "median_total_s", "prompt_tokens", "prompt_recall"}
    assert all(keys <= set(s) for s in systems)
    assert d["summary"]["ttft_ratio_vs_langchain_k20"] > 0
    # k=20 over a corpus of a few chunks: LangChain stuffs all of them.
    assert systems[2]["prompt_tokens"] > systems[1]["prompt_tokens"]
    assert d["config"]["vector_agreement_min_cos"] > 0.999


def test_bench_peer_asks_again_with_the_passage_store_warm_when_splicing(run, corpus, tmp_path):
    pytest.importorskip("langchain_community", reason="the bench extra is not installed")
    result = run("--splice-fresh", "0", "bench", "peer", "--corpus", corpus, "--include", "*",
                 "--questions", _questions_file(tmp_path), "--limit", "1", "--k", "1", "--max-tokens", "2",
                 "--index", tmp_path / "index", "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert [s["name"] for s in d["summary"]["systems"]] == ["rag-budget", "langchain k=1", "rag-budget, store warm"]
    assert d["config"]["splice_fresh"] == 0 and d["config"]["settled_s"] is not None
    assert d["summary"]["warm_ttft_ratio_vs_langchain_k1"] > 0


def test_engine_options_that_cannot_work_together_are_not_a_missing_model(run, corpus, tmp_path):
    index = tmp_path / "index"
    run("ingest", corpus, "--index", index)
    result = run("--kv-type", "q8_0", "--no-flash-attn", "ask", "What is prefill?", "--index", index)
    assert_clean_error(result, "engine settings", "flash attention")
    assert "model" not in result.stderr.split("flash attention")[0].lower()
    with pytest.raises(EngineMisconfigured):
        Pipeline.open(index, settings=Settings.load(kv_type="q8_0", flash_attn=False)).backend


def test_ctrl_c_says_what_was_kept_only_where_it_is_true(run, corpus, tmp_path, monkeypatch):
    index = tmp_path / "index"
    run("ingest", corpus, "--index", index)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Pipeline, "search", interrupted)
    result = run("search", "bread", "--index", index)
    assert result.exit_code == 130 and "interrupted" in result.stderr
    assert "index" not in result.stderr and "Traceback" not in result.output
    monkeypatch.setattr(Pipeline, "ingest", interrupted)
    result = run("ingest", corpus, "--index", index)
    assert result.exit_code == 130 and "the index is as it was" in result.stderr


def test_every_variable_reaches_every_command(run, corpus, tmp_path, monkeypatch):
    index = tmp_path / "env-index"
    monkeypatch.setenv("RAG_INDEX", str(index))
    assert run("ingest", corpus).exit_code == 0
    assert index.is_dir()
    monkeypatch.setenv("RAG_RETRIEVAL", "bm25")
    doctor = json.loads(run("doctor", "--json").stdout)
    assert doctor["retrieval"] == "bm25" and doctor["index"]["path"] == str(index)
    monkeypatch.setenv("RAG_TARGET_TTFT", "0.7")
    answer = json.loads(run("ask", "What limits decode?", "--max-tokens", "4", "--json").stdout)
    assert answer["budget"]["target_ttft_s"] == 0.7
    monkeypatch.setenv("RAG_RETRIEVAL", "sideways")
    assert_clean_error(run("search", "bread"), "RAG_RETRIEVAL")


def test_bench_serve_runs_the_scheduler_and_one_at_a_time_side_by_side(run, corpus, tmp_path, monkeypatch):
    # Its servers take no caller limits (--limits off, the default), whatever RAG_SERVE_* says: with one
    # question in flight a caller, the two clients' questions side by side would be refused (rate_limited).
    monkeypatch.setenv("RAG_SERVE_QUESTIONS_IN_FLIGHT", "1")
    result = run("bench", "serve", "--corpus", corpus, "--include", "*", "--index", tmp_path / "index",
                 "--clients", "1,2", "--requests", "2", "--max-tokens", "4", "--slots", "2", "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    runs = d["summary"]["runs"]
    assert [(r["clients"], r["system"]) for r in runs] == [(1, "scheduler"), (1, "one at a time"),
                                                          (2, "scheduler"), (2, "one at a time")]
    keys = {"goodput_rps", "served_share", "degraded_share", "tok_s", "mean_decode_batch", "p95_ttft_s", "errors"}
    assert all(keys <= set(r) for r in runs) and all(r["errors"] == 0 for r in runs)
    assert not any("rate_limited" in r["refused"] for r in runs) and d["config"]["limits"] == "off"
    assert all(r["mean_decode_batch"] >= 1 for r in runs if r["served"])
    assert d["summary"]["bound"]["requests_per_window"] > 0


def test_bench_serve_starts_a_server_cold_and_uploads_beside_its_first_run(run, corpus, tmp_path):
    upload = tmp_path / "owls.md"
    upload.write_text("# Owls\n\nOwls hunt at night and sleep by day.\n", encoding="utf-8")
    # Both served on any machine: a target no machine's load misses (at 2 s a slow one may refuse the second, 429).
    result = run("bench", "serve", "--corpus", corpus, "--include", "*", "--index", tmp_path / "index",
                 "--clients", "2", "--requests", "2", "--max-tokens", "4", "--slots", "2", "--system", "scheduler",
                 "--fresh", "--upload", upload, "--target-ttft", "60", "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    (only,) = d["summary"]["runs"]
    assert d["config"]["fresh_ready_s"]["scheduler"] > 0 and d["config"]["upload"] == "owls.md"
    assert only["upload_status"] == 200 and only["served"] == 2 and only["errors"] == 0


def test_bench_serve_can_warm_the_passage_store_before_its_runs(run, corpus, tmp_path):
    args = ["bench", "serve", "--corpus", corpus, "--include", "*", "--index", tmp_path / "index", "--clients", "2",
            "--requests", "2", "--max-tokens", "4", "--slots", "2", "--system", "scheduler", "--warm-store", "--json"]
    result = run("--splice-fresh", "0", *args)
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["config"]["store_warmed_s"]["scheduler"] > 0 and d["summary"]["runs"][0]["errors"] == 0
    off = json.loads(run(*args).stdout)  # splicing off: nothing to warm, said so
    assert off["config"]["store_warmed_s"] == {"scheduler": None}
