"""Tool calls through the OpenAI API (``--tool-call-parser``), with the official ``openai`` SDK
and raw ``httpx`` SSE against the real server: calls read into ``tool_calls``, streamed as
OpenAI's deltas (checked with the SDK's own stream accumulator), a whole agent loop, tool_choice
and parallel_tool_calls, tool turns rendered by the chat template (checked against transformers'
``apply_chat_template`` on the same conversation), and the 400s of bad shapes. The model is
scripted (scripted_engine.py): a random tiny model never writes a call."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.sglang_kvc.server.scripted_engine import ASK, QWEN_STYLE_TEMPLATE, TOOLS, ScriptedEngine, as_template_messages

openai = pytest.importorskip("openai")

CALL_ARGS = '{"expression": "37 * 91"}'
NAMED = {"type": "function", "function": {"name": "calculator"}}


def _start(model_dir, parser, template=None):
    from sglang_kvc.server.app import ServerThread

    from tests.sglang_kvc.conftest import free_port

    engine = ScriptedEngine(model_dir, parser, template)
    srv = ServerThread(engine, port=free_port()).start()
    srv.engine = engine
    return srv


@pytest.fixture(scope="module")
def servers(tiny_models):
    """name -> a server: qwen25 with a Qwen2.5-style template, qwen25 with plain ChatML
    (SmolLM2's kind: no tool rendering), and one without a parser."""
    model = tiny_models["qwen2.5"]
    started = {"qwen": _start(model, "qwen25", QWEN_STYLE_TEMPLATE), "chatml": _start(model, "qwen25"),
               "plain": _start(model, None, QWEN_STYLE_TEMPLATE)}
    yield started
    for srv in started.values():
        srv.stop()


@pytest.fixture(scope="module")
def client(servers):
    return openai.OpenAI(base_url=servers["qwen"].url + "/v1", api_key="none")


def _ask(client, text, **kw):
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}],
                                          tools=TOOLS, **kw)


def _streamed(client, text, **kw):
    """The SDK's accumulated completion of a streamed request, and every chunk."""
    with client.beta.chat.completions.stream(
            model="m", messages=[{"role": "user", "content": text}], tools=TOOLS, **kw) as s:
        chunks = [e.chunk for e in s if e.type == "chunk"]
        return s.get_final_completion(), chunks


def _calls(message) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


def test_a_call_comes_back_as_tool_calls(client):
    choice = _ask(client, ASK).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I will compute."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert (call.function.name, json.loads(call.function.arguments)) == \
        ("calculator", {"expression": "37 * 91"})


def test_stream_accumulates_to_the_same_calls(client):
    final, chunks = _streamed(client, ASK)
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content.strip() == "I will compute."
    assert _calls(choice.message) == [("calculator", CALL_ARGS)]
    deltas = [tc for ch in chunks for tc in ch.choices[0].delta.tool_calls or []]
    first = deltas[0]  # OpenAI's order: id, type and name first, then the arguments in pieces
    assert (first.index, first.type, first.function.name, first.function.arguments) == \
        (0, "function", "calculator", "")
    assert first.id.startswith("call_") and all(d.id is None for d in deltas[1:])
    assert len(deltas) > 2 and "".join(d.function.arguments for d in deltas) == CALL_ARGS
    assert not any("<tool" in (ch.choices[0].delta.content or "") for ch in chunks)


def test_agent_loop_call_tool_answer(client, servers):
    messages = [{"role": "user", "content": ASK}]
    reply = client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
    (call,) = reply.tool_calls
    result = str(eval(json.loads(call.function.arguments)["expression"]))  # the "tool"
    messages += [reply.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": result}]
    final = client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0]
    assert (final.message.content, final.message.tool_calls, final.finish_reason) == \
        ("The answer is 3367.", None, "stop")
    engine = servers["qwen"].engine
    expected = engine.tokenizer.apply_chat_template(as_template_messages(
        [{"role": "user", "content": ASK},
         {"role": "assistant", "content": "I will compute.", "tool_calls": [
             {"id": call.id, "type": "function", "function": {"name": "calculator", "arguments": CALL_ARGS}}]},
         {"role": "tool", "tool_call_id": call.id, "content": "3367"}]),
        tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert engine.prompts[-1] == expected


def test_plain_chatml_gets_the_calls_written_into_the_turn(servers):
    """A template without tool rendering (SmolLM2's): the call is written in the parser's format."""
    c = openai.OpenAI(base_url=servers["chatml"].url + "/v1", api_key="none")
    messages = [{"role": "user", "content": ASK},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": CALL_ARGS}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "3367"}]
    c.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": '
            '{"expression": "37 * 91"}}\n</tool_call><|im_end|>\n<|im_start|>tool\n3367<|im_end|>') \
        in servers["chatml"].engine.prompts[-1]


def test_malformed_call_stays_text(client):
    raw = '<tool_call>\n{"name": calculator}\n</tool_call>'
    choice = _ask(client, "Break the call.").choices[0]
    assert (choice.message.content, choice.message.tool_calls, choice.finish_reason) == (raw, None, "stop")
    final, _ = _streamed(client, "Break the call.")
    assert final.choices[0].message.content == raw and not final.choices[0].message.tool_calls


def test_no_call_is_plain_content(client):
    choice = _ask(client, "Say hello.").choices[0]
    assert (choice.message.content, choice.message.tool_calls, choice.finish_reason) == \
        ("Hello there.", None, "stop")


@pytest.mark.parametrize("parallel, expected", [(None, ["1 + 1", "2 + 2"]), (False, ["1 + 1"])])
def test_parallel_tool_calls(client, parallel, expected):
    kw = {} if parallel is None else {"parallel_tool_calls": parallel}
    want = [("calculator", json.dumps({"expression": e})) for e in expected]
    assert _calls(_ask(client, "Add 1 + 1 and 2 + 2.", **kw).choices[0].message) == want
    final, chunks = _streamed(client, "Add 1 + 1 and 2 + 2.", **kw)
    assert _calls(final.choices[0].message) == want


def test_tool_choice_none_renders_no_tools_and_parses_nothing(client, servers):
    choice = _ask(client, ASK, tool_choice="none").choices[0]
    assert "<tools>" not in servers["qwen"].engine.prompts[-1]
    assert choice.message.tool_calls is None and "<tool_call>" in choice.message.content


@pytest.mark.parametrize("choice, opening", [
    (NAMED, '<tool_call>\n{"name": "calculator", "arguments": '), ("required", '<tool_call>\n{"name": "')])
def test_forced_call_is_prefilled(client, servers, choice, opening):
    got = _ask(client, "Call the calculator on 2 + 2.", tool_choice=choice).choices[0]
    assert servers["qwen"].engine.prompts[-1].endswith("<|im_start|>assistant\n" + opening)
    assert got.finish_reason == "tool_calls" and got.message.content is None
    assert _calls(got.message) == [("calculator", '{"expression": "2 + 2"}')]
    final, _ = _streamed(client, "Call the calculator on 2 + 2.", tool_choice=choice)
    assert _calls(final.choices[0].message) == [("calculator", '{"expression": "2 + 2"}')]


def test_raw_sse_with_httpx(servers):
    """Another client: the SSE lines read by hand, the calls assembled by index."""
    body = {"model": "m", "messages": [{"role": "user", "content": ASK}], "tools": TOOLS, "stream": True}
    calls: dict[int, dict] = {}
    reasons = []
    with httpx.stream("POST", servers["qwen"].url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            reasons.append(choice["finish_reason"])
            for d in choice["delta"].get("tool_calls") or []:
                slot = calls.setdefault(d["index"], {"name": "", "arguments": ""})
                slot["name"] += d.get("function", {}).get("name") or ""
                slot["arguments"] += d.get("function", {}).get("arguments") or ""
    assert calls == {0: {"name": "calculator", "arguments": CALL_ARGS}}
    assert reasons[-1] == "tool_calls" and set(reasons[:-1]) == {None}


BAD = [
    ({"tool_choice": {"type": "function", "function": {"name": "search"}}}, "not among tools"),
    ({"tools": None, "tool_choice": "required"}, "needs a non-empty tools list"),
    ({"tool_choice": "sometimes"}, "tool_choice must be"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls must be a boolean"),
    ({"messages": [{"role": "user", "content": ASK}, {"role": "tool", "content": "1"}]}, "tool_call_id"),
    ({"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "calculator", "arguments": "{oops"}}]}]},
     "arguments is not valid JSON"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c"}]}]}, "tool_calls[0] must be"),
    ({"messages": ["hi"]}, "messages[0] must be an object"),
]


@pytest.mark.parametrize("extra, message", BAD, ids=[m for _, m in BAD])
def test_bad_tool_shapes_are_400(servers, extra, message):
    body = {"model": "m", "messages": [{"role": "user", "content": ASK}], "tools": TOOLS, **extra}
    r = httpx.post(servers["qwen"].url + "/v1/chat/completions", json=body)
    assert r.status_code == 400 and message in r.json()["message"], r.text


def test_forcing_a_call_needs_a_parser(servers):
    c = openai.OpenAI(base_url=servers["plain"].url + "/v1", api_key="none")
    with pytest.raises(openai.BadRequestError, match="--tool-call-parser"):
        _ask(c, ASK, tool_choice="required")
    assert _ask(c, ASK).choices[0].message.tool_calls is None  # no parser: the call is text


def test_unknown_parser_is_a_cli_error():
    r = subprocess.run([sys.executable, "-m", "sglang_kvc.launch_server", "--model-path", "x",
                        "--tool-call-parser", "nonesuch"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "--tool-call-parser" in r.stderr and "qwen25" in r.stderr and "llama3" in r.stderr


def test_real_engine_answer_without_a_call_is_unchanged(serve, tiny_models, hf_reference):
    """On the real engine, parsing on: an answer with no call is the model's text (checked
    against Hugging Face's greedy tokens), with no tool_calls."""
    srv = serve("qwen2.5", tool_call_parser="qwen25")
    messages = [{"role": "user", "content": "1 2 3"}]
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
    got = c.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=8,
                                    temperature=0, extra_body={"ignore_eos": True}).choices[0]
    tok = srv.engine.tokenizer
    ids = tok.encode(tok.apply_chat_template(messages, tools=TOOLS, tokenize=False,
                                             add_generation_prompt=True), add_special_tokens=False)
    expected = tok.decode(hf_reference(tiny_models["qwen2.5"], ids, 8), skip_special_tokens=True)
    assert (got.message.content, got.message.tool_calls, got.finish_reason) == (expected, None, "length")
