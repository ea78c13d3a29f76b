#!/usr/bin/python3
"""Renders a chat template as transformers' apply_chat_template does, with the real Jinja2: the
reference anvil's own Jinja interpreter is checked against.

usage: chat_template_reference.py TEMPLATE VARIABLES.json
       chat_template_reference.py --cases CASES.json OUT_DIR
TEMPLATE is a tokenizer directory (its chat_template.jinja, else tokenizer_config.json's
chat_template) or a .jinja file. VARIABLES holds "messages" and the other variables; the special
tokens of the directory's tokenizer_config.json are added as transformers adds them. Writes the
rendering to standard output, or "ERROR: ..." when rendering fails.
With --cases, each case of CASES.json ({name, template, variables}) is written to OUT_DIR as
NAME.jinja, NAME.json and its rendering NAME.txt.

usage: chat_template_reference.py --foundry-turns TOKENIZER_DIR RECORDS.jsonl OUT_DIR
Cuts each chat record into turns as LLM Foundry's _slice_chat_formatted_example does (each
assistant message ends a turn; the prompt is the rendering with the generation prompt of the
messages before it, less the chat through the previous turn; the response the rest of the
rendering through it) and writes OUT_DIR/RRRR.TT.prompt and .response, one file per text.

transformers' environment (chat_template_utils.py): an ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, the loop-controls extension and {% generation %}; tojson is json.dumps with
ensure_ascii=False; raise_exception and strftime_now are globals; tools and documents are passed
as None unless given.
"""
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

SPECIAL = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


def content(t):
    if isinstance(t, dict):
        return t.get("content")
    return t


def load(path):
    special = {}
    if os.path.isdir(path):
        jinja_file = os.path.join(path, "chat_template.jinja")
        config = {}
        config_file = os.path.join(path, "tokenizer_config.json")
        if os.path.exists(config_file):
            with open(config_file, encoding="utf-8") as f:
                config = json.load(f)
        for key in SPECIAL:
            if config.get(key) is not None and content(config[key]) is not None:
                special[key] = content(config[key])
        if "additional_special_tokens" in config:
            special["additional_special_tokens"] = [content(t) for t in config["additional_special_tokens"]]
        if os.path.exists(jinja_file):
            with open(jinja_file, encoding="utf-8") as f:
                return f.read(), special
        template = config["chat_template"]
        if isinstance(template, list):
            template = {t["name"]: t["template"] for t in template}["default"]
        return template, special
    with open(path, encoding="utf-8") as f:
        return f.read(), special


class Generation(Extension):
    """transformers' {% generation %}...{% endgeneration %} (its AssistantTracker): marks the
    assistant's text and renders it unchanged."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def render(template, special, variables):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    kwargs = {"tools": None, "documents": None, "add_generation_prompt": False}
    kwargs.update(special)
    kwargs.update(variables)
    try:
        return env.from_string(template).render(**kwargs)
    except Exception as e:  # what anvil must refuse too
        return "ERROR: %s" % e


def foundry_turns(template, special, messages):
    turns, previous = [], ""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        full = render(template, special, {"messages": messages[:i + 1]})
        prompt = render(template, special, {"messages": messages[:i], "add_generation_prompt": True})
        assert full.startswith(previous) and prompt.startswith(previous) and full.startswith(prompt)
        turns.append((prompt[len(previous):], full[len(prompt):]))
        previous += turns[-1][0] + turns[-1][1]
    return turns


def main():
    if sys.argv[1] == "--foundry-turns":
        template, special = load(sys.argv[2])
        out = sys.argv[4]
        with open(sys.argv[3], encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
        for r, record in enumerate(records):
            for t, (prompt, response) in enumerate(foundry_turns(template, special, record["messages"])):
                for kind, text in (("prompt", prompt), ("response", response)):
                    with open(os.path.join(out, "%04d.%02d.%s" % (r, t, kind)), "w", encoding="utf-8", newline="") as f:
                        f.write(text)
        return
    if sys.argv[1] == "--cases":
        with open(sys.argv[2], encoding="utf-8") as f:
            cases = json.load(f)
        out = sys.argv[3]
        for case in cases:
            base = os.path.join(out, case["name"])
            with open(base + ".jinja", "w", encoding="utf-8", newline="") as f:
                f.write(case["template"])
            with open(base + ".json", "w", encoding="utf-8") as f:
                json.dump(case["variables"], f, ensure_ascii=False)
            with open(base + ".txt", "w", encoding="utf-8", newline="") as f:
                f.write(render(case["template"], {}, case["variables"]))
        return
    template, special = load(sys.argv[1])
    with open(sys.argv[2], encoding="utf-8") as f:
        variables = json.load(f)
    sys.stdout.buffer.write(render(template, special, variables).encode("utf-8"))


if __name__ == "__main__":
    main()
