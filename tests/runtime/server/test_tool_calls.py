"""Tool calls: through the real server with the openai client (required and named calls are grammar-constrained, so
even random weights give arguments that validate), the template rendered with the tools, and the parsers of
`tool_choice: auto` output on the formats models write."""
import json
import shutil

import httpx
import jsonschema
import openai
import pytest

from kubeinfer.runtime.server.tool_output import ToolOutput
from kubeinfer.runtime.server.tool_parsers import parse_tool_calls
from kubeinfer.runtime.server.tools import plan_tools
from kubeinfer.runtime.tokenizer import Tokenizer

MODEL = "tiny"
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1,
                                                                                  "maximum": 7}}}
TIME = {"type": "object", "additionalProperties": False, "required": ["zone"],
        "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "forecast", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
# A Hermes/Qwen-style template that renders the tools (their names: the tiny model's context is short).
TEMPLATE = ("{% if tools %}<|im_start|>system\n# Tools\n{% for tool in tools %}- {{ tool.function.name }}\n{% endfor %}"
            "<|im_end|>\n{% endif %}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
            "{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% endif %}")
MESSAGES = [{"role": "user", "content": "weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_server(llama_dir, tmp_path_factory, start_server):
    model_dir = tmp_path_factory.mktemp("tools") / "llama"
    shutil.copytree(llama_dir, model_dir)
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": TEMPLATE}))
    with start_server(model_dir, max_model_len=512, json_layout="compact") as (url, _):   # random weights
        yield url, model_dir


@pytest.fixture(scope="module")
def client(tool_server):
    return openai.OpenAI(base_url=tool_server[0] + "/v1", api_key="unused", max_retries=0)


def assert_valid_calls(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_calls_validate_and_the_template_sees_the_tools(client, tool_server):
    result = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                            n=6, temperature=1.0, seed=4, max_tokens=200)
    for choice in result.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert_valid_calls(choice.message.tool_calls)
    single = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                            parallel_tool_calls=False, temperature=1.0, seed=1, max_tokens=200)
    assert len(single.choices[0].message.tool_calls) == 1
    tokenizer = Tokenizer(tool_server[1])
    tools_text = "- get_weather\n- get_time\n"
    prompt = (f"<|im_start|>system\n# Tools\n{tools_text}<|im_end|>\n<|im_start|>user\nweather in Paris?<|im_end|>\n"
              "<|im_start|>assistant\n")
    assert result.usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                           max_tokens=4, temperature=0)
    assert plain.usage.prompt_tokens < result.usage.prompt_tokens and not plain.choices[0].message.tool_calls


def test_a_named_function_is_called_and_streams_the_same(client):
    choice = {"type": "function", "function": {"name": "get_time"}}
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=choice,
                                           temperature=0, max_tokens=100)
    [call] = whole.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    assert_valid_calls([call])
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=choice,
                                                 temperature=0, max_tokens=100, stream=True))
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(d.function.name, d.function.arguments) for d in deltas] == [("get_time", call.function.arguments)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("fields, param", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}]},
     "tools[0].function.parameters"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
])
def test_bad_tools_are_400s_naming_the_param(tool_server, fields, param):
    body = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS} | fields
    reply = httpx.post(tool_server[0] + "/v1/chat/completions", json=body)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text


def test_auto_parsers_read_the_formats_models_write():
    content, calls = parse_tool_calls("hermes", 'Let me look.\n<tool_call>\n{"name": "get_time", "arguments": '
                                                '{"zone": "UTC"}}\n</tool_call>\n<tool_call>{"name": "get_weather", '
                                                '"arguments": {"city": "Oslo", "days": 2}}</tool_call>')
    assert content == "Let me look.\n" and [c["function"]["name"] for c in calls] == ["get_time", "get_weather"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Oslo", "days": 2}
    content, calls = parse_tool_calls("llama3_json", '<|python_tag|>{"name": "get_time", "parameters": {"zone": '
                                                     '"CET"}}; {"name": "get_time", "parameters": {"zone": "PST"}}')
    assert content is None and [json.loads(c["function"]["arguments"])["zone"] for c in calls] == ["CET", "PST"]
    for parser, text in (("hermes", "no call here"), ("hermes", "<tool_call>{not json</tool_call>"),
                         ("llama3_json", "{\"answer\": 42}"), ("llama3_json", "plain text")):
        assert parse_tool_calls(parser, text) == (text, [])


def test_a_stream_holds_back_what_may_be_a_call():
    output = ToolOutput(plan_tools(TOOLS, "auto", None, flat=False), "hermes")
    text = 'Sure. <tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>'
    sent, calls = [], []
    for end in range(1, len(text) + 1):
        delta, new_calls = output.step(0, text[:end], end == len(text), "stop" if end == len(text) else None)
        sent.append(delta)
        calls += new_calls
    assert "".join(sent) == output.final(text, "stop")[0] == "Sure. " and [c["function"]["name"] for c in calls] == ["get_time"]
    plain = ToolOutput(plan_tools(TOOLS, "auto", None, flat=False), "hermes")
    assert plain.step(0, "a <tool", False, None) == ("a ", [])   # held: may open a call
    assert plain.step(0, "a <toolbox", True, "stop") == ("<toolbox", [])   # was none: sent as content


def test_responses_call_tools_and_take_their_output_back(client, tool_server):
    flat = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]}
            for t in TOOLS]
    response = client.responses.create(model=MODEL, input="weather in Paris?", tools=flat, tool_choice="required",
                                       parallel_tool_calls=False, temperature=0, max_output_tokens=200)
    [call] = [item for item in response.output if item.type == "function_call"]
    assert response.status == "completed" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    events = list(client.responses.create(model=MODEL, input="weather in Paris?", tools=flat, tool_choice="required",
                                          parallel_tool_calls=False, temperature=0, max_output_tokens=200,
                                          stream=True))
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert (done.name, done.arguments) == (call.name, call.arguments)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed" and events[-1].response.output[0].arguments == call.arguments
    named = client.responses.create(model=MODEL, input="time?", tools=flat, max_output_tokens=100, temperature=0,
                                    tool_choice={"type": "function", "name": "get_time"})
    assert [item.name for item in named.output] == ["get_time"]
    follow = client.responses.create(model=MODEL, previous_response_id=response.id, tools=flat, tool_choice="none",
                                     max_output_tokens=4, temperature=0, input=[
                                         {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    # the stored call (no text) and the tool's output continue the conversation; tool_choice none: no tools shown
    prompt = ("<|im_start|>user\nweather in Paris?<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
              "<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n")
    tokenizer = Tokenizer(tool_server[1])
    assert follow.usage.input_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))
    assert follow.output[0].type == "message"
