"""The tool-call formats (qwen25/hermes tags, llama3 JSON) on complete texts, and the streamed
view: fed the text in every split, the deltas add up to the complete text's parse, and nothing
that becomes a call is ever sent as content."""

from __future__ import annotations

import json

import pytest

from sglang_kvc.function_call import FORMATS, PARSERS, get_format
from sglang_kvc.function_call.scan import scan
from sglang_kvc.function_call.stream import CallStream, is_text

QWEN = FORMATS["qwen25"]
LLAMA = FORMATS["llama3"]
CALC = '{"name": "calc", "arguments": {"expression": "2 * 3", "note": "a } in \\"quotes\\""}}'


def _complete(fmt, text):
    """(content, [(name, arguments text)]) of a complete text, as the non-streaming response."""
    segs = scan(fmt, text)
    return "".join(s.text for s in segs if is_text(s)), \
        [(s.name, s.arguments_text) for s in segs if not is_text(s)]


def _stream(fmt, pieces):
    """The same, accumulated from the deltas of a text arriving in ``pieces``."""
    stream, content, calls, text = CallStream(fmt), "", {}, ""
    for k, piece in enumerate(pieces):
        text += piece
        d = stream.feed(text, final=k == len(pieces) - 1)
        content += d.content
        for tc in d.tool_calls:
            name, args = calls.get(tc["index"], ("", ""))
            calls[tc["index"]] = (name + tc["function"].get("name", ""), args + tc["function"]["arguments"])
    return content, [calls[i] for i in sorted(calls)]


TEXTS = {
    "qwen25": ["I will compute.\n<tool_call>\n" + CALC + "\n</tool_call>",
               "<tool_call>" + CALC + "</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call> done",
               "a <toolbox> is not a call, nor is <tool_call",
               '<tool_call>\n{"name": calc}\n</tool_call> after',
               '<tool_call>{"arguments": {"x": 1}, "name": "late"}</tool_call>'],
    "llama3": ['<|python_tag|>{"name": "calc", "parameters": {"x": 1}}',
               '{"name": "a", "parameters": {"x": [1, 2]}}; {"name": "b", "parameters": {}}',
               '{"answer": 42} is not a call', "Some text, then {\"name\": \"a\"} stays text",
               "  "],
}


@pytest.mark.parametrize("name, text", [(n, t) for n, ts in TEXTS.items() for t in ts])
def test_stream_adds_up_to_the_complete_parse(name, text):
    fmt = FORMATS[name]
    expected = _complete(fmt, text)
    assert _stream(fmt, list(text)) == expected  # one character at a time
    for cut in range(1, len(text)):
        assert _stream(fmt, [text[:cut], text[cut:]]) == expected


def test_stream_holds_back_what_may_open_a_call():
    stream = CallStream(QWEN)
    assert stream.feed("Sure. <tool_c", final=False).content == "Sure. "
    d = stream.feed("Sure. <tool_call>\n{\"name\": \"calc\", \"arguments\": {\"a", final=False)
    assert d.content == "" and d.tool_calls[0]["function"] == {"name": "calc", "arguments": ""}
    assert d.tool_calls[1]["function"]["arguments"] == '{"a'


def test_qwen25_reads_calls_and_the_text_around_them():
    content, calls = _complete(QWEN, TEXTS["qwen25"][0])
    assert content == "I will compute.\n"
    assert [(n, json.loads(a)) for n, a in calls] == \
        [("calc", {"expression": "2 * 3", "note": 'a } in "quotes"'})]
    assert calls[0][1] == CALC[CALC.index('{"expression'):-1]  # the model's own text


def test_arguments_given_as_a_string_are_dumped():
    (seg,) = scan(QWEN, '<tool_call>{"name": "f", "arguments": "{\\"y\\": 2}"}</tool_call>')
    assert seg.call.arguments == {"y": 2} and seg.arguments_text == '{"y": 2}'


def test_malformed_and_unclosed_calls_are_reported_for_the_trainer():
    calls = PARSERS["qwen25"]('<tool_call>{name: a}</tool_call> <tool_call>{"name": "b"')
    assert [c.error for c in calls] == ["the tool call is not valid JSON (Expecting property name "
                                        "enclosed in double quotes)",
                                        "the tool call is not closed with </tool_call>"]


def test_llama3_reads_tagged_bare_and_chained_calls():
    assert _complete(LLAMA, TEXTS["llama3"][0]) == ("", [("calc", '{"x": 1}')])
    assert _complete(LLAMA, TEXTS["llama3"][1]) == ("", [("a", '{"x": [1, 2]}'), ("b", "{}")])
    assert _complete(LLAMA, TEXTS["llama3"][2]) == (TEXTS["llama3"][2], [])
    assert _complete(LLAMA, TEXTS["llama3"][3]) == (TEXTS["llama3"][3], [])


def test_prefills_open_a_call_the_parser_reads():
    for fmt, rest in ((QWEN, '{"x": 1}}\n</tool_call>'), (LLAMA, '{"x": 1}}')):
        assert _complete(fmt, fmt.prefill("calc") + rest) == ("", [("calc", '{"x": 1}')])
        assert _complete(fmt, fmt.prefill(None) + 'calc", "arguments": ' + rest)[1] == [("calc", '{"x": 1}')]


def test_render_is_what_the_parser_reads():
    for fmt in (QWEN, LLAMA):
        assert _complete(fmt, fmt.render("calc", {"x": "é"})) == ("", [("calc", '{"x": "é"}')])


def test_unknown_name_lists_the_names():
    with pytest.raises(ValueError, match="qwen25, hermes, llama3"):
        get_format("mistral")
