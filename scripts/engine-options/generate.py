#!/usr/bin/env python3
"""Dumps the real command-line parser of a vLLM or SGLang release as data.

Run by scripts/engine-options/generate, inside a venv that holds the engine:

    generate.py requirements WHEEL      the engine's dependencies the parser needs
    generate.py dump --engine vllm --version 0.34.0 --out FILE
    generate.py unavailable --file UNAVAILABLE.md --engine E --version V (--reason R | --clear)

The parser is not rebuilt by hand: the engine's own entry point is run until
it calls parse_args, and the parser it built is taken from that call. Every
verdict in "cases" is what that parser did with the argv, in this process.
"""

import argparse
import contextlib
import datetime
import functools
import inspect
import io
import json
import linecache
import logging
import os
import re
import sys
import warnings

# Packages an engine requires that its argument parser never imports: CUDA
# kernels, distributed runtimes and media codecs. Most have no CPU build or
# need a GPU toolchain to install; all of them only cost time and disk here.
# torch itself is kept: the engines import it at module level.
NOT_NEEDED_BY_THE_PARSER = {
    "apache-tvm-ffi",
    "cuda-python",
    "cupy-cuda12x",
    "decord",
    "decord2",
    "deepseek-recipe",
    "fastsafetensors",
    "flash-attn",
    "flash-attn-4",
    "flashinfer-cubin",
    "flashinfer-jit-cache",
    "flashinfer-python",
    "humming-kernels",
    "instanttensor",
    "kernels",
    "nixl",
    "nvidia-cudnn-frontend",
    "nvidia-cutlass-dsl",
    "nvidia-mathdx",
    "nvshmem4py-cu12",
    "nvshmem4py-cu13",
    "nvtx",
    "py-spy",
    "pynvvideocodec",
    "quack-kernels",
    "ray",
    "sgl-deep-ep",
    "sgl-deep-gemm",
    "sgl-flash-mla",
    "sgl-kernel",
    "sglang-kernel",
    "tilelang",
    "tml-renderers",
    "tokenspeed-mla",
    "torch-memory-saver",
    "torchao",
    "torchaudio",
    "torchcodec",
    "torchvision",
    "xformers",
}

# Terminal width argparse wraps usage and help to. An engine started by a
# supervisor has no terminal, and argparse then falls back to 80 columns.
COLUMNS = 80

MODEL = "/models/m"


# ---------------------------------------------------------------------------
# requirements / unavailable: helpers for the driver script
# ---------------------------------------------------------------------------


def cmd_requirements(wheel):
    import zipfile
    from email.parser import Parser

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(z.read(name).decode())
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if canonicalize_name(req.name) in NOT_NEEDED_BY_THE_PARSER:
            continue
        req.marker = None
        print(req)


def cmd_unavailable(path, engine, version, reason, clear):
    head = "# Engine versions whose parser could not be dumped\n\n"
    head += "Written by scripts/engine-options/generate; an entry goes away when a\n"
    head += "later run of that version succeeds.\n"
    entries = {}
    if os.path.exists(path):
        text = open(path, encoding="utf-8").read()
        for block in re.split(r"^## ", text, flags=re.M)[1:]:
            title, _, body = block.partition("\n")
            entries[title.strip()] = body.strip("\n")
    key = f"{engine} {version}"
    if clear:
        if key not in entries:
            return
        del entries[key]
    else:
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        entries[key] = f"Tried {when} on Python {sys.version.split()[0]}.\n\n```\n{reason.strip()}\n```"
    if not entries:
        if os.path.exists(path):
            os.remove(path)
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(head)
        for title in sorted(entries):
            f.write(f"\n## {title}\n\n{entries[title]}\n")


# ---------------------------------------------------------------------------
# dump
# ---------------------------------------------------------------------------


class _Captured(BaseException):
    """Raised from inside parse_args to stop the entry point once it has built its parser."""


class _Parsed(BaseException):
    """Raised after parse_args returned, to stop the entry point before it starts the engine."""

    def __init__(self, namespace):
        super().__init__()
        self.namespace = namespace


def parse_through(entry_point):
    """Runs entry_point until its parse_args returns; gives back the namespace."""
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace))

    argparse.ArgumentParser.parse_args = parse_and_stop
    try:
        entry_point()
    except _Parsed as done:
        return done.namespace
    finally:
        argparse.ArgumentParser.parse_args = original
    raise RuntimeError("the entry point returned without calling parse_args")


def capture_parser(entry_point):
    """Runs entry_point until some parser's parse_args is called; returns that parser."""
    seen = []
    original = argparse.ArgumentParser.parse_args

    def grab(self, args=None, namespace=None):
        seen.append(self)
        raise _Captured

    argparse.ArgumentParser.parse_args = grab
    try:
        entry_point()
    except _Captured:
        pass
    finally:
        argparse.ArgumentParser.parse_args = original
    if not seen:
        raise SystemExit("the entry point returned without calling parse_args")
    return seen[0]


def site_relative(path):
    if not path:
        return None
    for base in sorted(sys.path, key=len, reverse=True):
        if base and path.startswith(base.rstrip("/") + "/"):
            return path[len(base.rstrip("/")) + 1 :]
    return path


def source_of(obj):
    try:
        target = inspect.unwrap(obj)
        file = inspect.getsourcefile(target)
        line = inspect.getsourcelines(target)[1]
    except (TypeError, OSError):
        return "builtin"
    return f"{site_relative(file)}:{line}"


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


def _site_dirs():
    import site

    dirs = set(site.getsitepackages())
    dirs.add(site.getusersitepackages())
    return sorted((d.rstrip("/") for d in dirs if d), key=len, reverse=True)


SITE_DIRS = _site_dirs()
HOME = os.path.expanduser("~").rstrip("/")


def scrub(text):
    """Blanks what changes from run to run or machine to machine: package dir, $HOME, UUIDs, addresses."""
    if not isinstance(text, str):
        return text
    for d in SITE_DIRS:
        text = text.replace(d + "/", "{site-packages}/")
    if HOME and HOME != "/":
        text = re.sub(re.escape(HOME) + r"(?=/|\b)", "~", text)
    text = _UUID.sub("{uuid}", text)
    return _ADDRESS.sub(" at 0x…", text)


def stable_repr(value):
    return scrub(repr(value))


def to_json(value):
    """The value as JSON when it is plain data (sets as sorted lists), else its repr."""
    if isinstance(value, (set, frozenset)) and all(isinstance(v, str) for v in value):
        return sorted(scrub(v) for v in value)
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return stable_repr(value)
    return _scrub_plain(value)


def _scrub_plain(value):
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, (list, tuple)):
        return [_scrub_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _scrub_plain(v) for k, v in value.items()}
    return value


ACTION_NAMES = {
    argparse._StoreAction: "store",
    argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false",
    argparse._StoreConstAction: "store_const",
    argparse._AppendAction: "append",
    argparse._AppendConstAction: "append_const",
    argparse._CountAction: "count",
    argparse._HelpAction: "help",
    argparse._VersionAction: "version",
    argparse._ExtendAction: "extend",
    argparse.BooleanOptionalAction: "boolean_optional",
}


def action_name(action):
    return ACTION_NAMES.get(type(action), type(action).__name__)


def action_base(action):
    """The argparse action a custom action class derives from (None: argparse.Action itself)."""
    for cls in type(action).__mro__:
        if cls in ACTION_NAMES:
            return ACTION_NAMES[cls]
    return None


def converter_name(conv):
    """A stable name for a type= converter, telling apart closures made by the same factory.

    Names must not change when only line numbers do, so that the data files
    of two versions can be compared: closures are named after their factory
    and what they close over, lambdas after their own source text.
    """
    if conv is None:
        return None
    if conv in (int, float, str, bool, complex):
        return conv.__name__
    if isinstance(conv, functools.partial):
        args = [short_name(a) for a in conv.args]
        args += [f"{k}={short_name(v)}" for k, v in conv.keywords.items()]
        return f"{converter_name(conv.func)}({', '.join(args)})"
    if inspect.isclass(conv):
        return conv.__qualname__
    module = getattr(conv, "__module__", None) or ""
    qual = getattr(conv, "__qualname__", None) or type(conv).__qualname__
    if module.split(".")[0] == "json":
        return f"json.{qual}"
    if qual.split(".")[-1] == "<lambda>":
        return lambda_text(conv) or f"lambda@{source_of(conv)}"
    if "<locals>" in qual:
        factory = qual.split(".<locals>")[0]
        local = qual.split(".")[-1]
        parts = []
        for cell in getattr(conv, "__closure__", None) or ():
            try:
                parts.append(short_name(cell.cell_contents))
            except ValueError:
                continue
        try:
            for pname, param in inspect.signature(conv).parameters.items():
                if param.default is not inspect.Parameter.empty:
                    parts.append(f"{pname}={short_name(param.default)}")
        except (TypeError, ValueError):
            pass
        if local == "_" + factory.split(".")[-1]:
            head = factory
        elif local.startswith("_"):
            head = f"{factory}.{local}"
        else:
            head = local
        return f"{head}({', '.join(parts)})"
    if inspect.ismethod(conv):
        return f"{type(conv.__self__).__name__}.{conv.__name__}"
    if not inspect.isfunction(conv) and not inspect.isbuiltin(conv):
        return type(conv).__qualname__
    return qual


def short_name(value):
    if callable(value):
        return converter_name(value)
    return stable_repr(value)


def lambda_text(fn):
    """The lambda's own expression, e.g. "lambda s: s.lower()", as ast.unparse writes it."""
    import ast

    try:
        file = inspect.getsourcefile(fn)
        tree = ast.parse(open(file, encoding="utf-8").read())
    except (OSError, TypeError, SyntaxError):
        return None
    line = fn.__code__.co_firstlineno
    found = [n for n in ast.walk(tree) if isinstance(n, ast.Lambda) and n.lineno == line]
    if len(found) != 1:
        return None
    return ast.unparse(found[0])


# What each converter accepts and how it fails, in words; "probes" in the data
# file shows the same on sample inputs, run through the real converter. When
# a converter raises ValueError or TypeError, argparse reports
# "argument FLAGS: invalid NAME value: REPR" (NAME = the function's __name__,
# REPR = Python repr() of the raw string); an ArgumentTypeError's own text is
# printed instead: "argument FLAGS: TEXT". Any other exception is a traceback.
TYPE_NOTES = {
    "*": {
        "int": "Python int(str): optional sign, surrounding whitespace, '_' between digits, any Unicode "
        "decimal digits; no '1.0', no '1e3'. Fails with 'invalid int value: %r'.",
        "float": "Python float(str): also 'nan', 'inf', '-Infinity', '1e3', '1_0.5', surrounding whitespace. "
        "Fails with 'invalid float value: %r'.",
        "str": "Anything, unchanged.",
        "bool": "Python bool(str): every non-empty string is True ('False' and '0' too), '' is False. Never fails.",
        "json.loads": "JSON text as Python's json module reads it (NaN, Infinity allowed; surrounding "
        "whitespace allowed). JSONDecodeError is a ValueError, so it fails with 'invalid loads value: %r'.",
    },
    "vllm": {
        "human_readable_int": "After strip(): DIGITS[.DIGITS] followed by one lower-case decimal suffix "
        "(k=1e3, m=1e6, g=1e9, t=1e12 where the version has it; int(float(n)*mult), so decimals allowed) or "
        "one upper-case binary suffix (K=2^10, M=2^20, G=2^30, T=2^40; integer only, else ArgumentTypeError "
        "'Decimals are not allowed with binary suffixes like K. Did you mean to use 1.5k instead?'); "
        "anything else goes to int(value), failing with 'invalid human_readable_int value: %r'. "
        "Suffixes per version: see doc and probes.",
        "human_readable_int_or_auto": "'-1' or 'auto' (any case, after strip()) give -1; else as "
        "human_readable_int, failing with 'invalid human_readable_int_or_auto value: %r'.",
        "parse_type": "Calls the wrapped converter; its ValueError becomes ArgumentTypeError "
        "'Value {val} cannot be converted to {wrapped!s}.' where {wrapped!s} is the str() of the wrapped "
        "callable (\"<class 'int'>\", '<function loads at 0x…>': a real memory address).",
        "optional_type": "'' and 'None' give None; anything else goes through parse_type(wrapped), so a "
        "failure reads 'Value {val} cannot be converted to {wrapped!s}.' (ArgumentTypeError), except an "
        "ArgumentTypeError of the wrapped converter, which passes through unchanged.",
        "union_dict_and_str": "A value that is not, after optional whitespace, '{...}' is kept as a string; "
        "one that looks like an object goes to optional_type(json.loads): 'Value {val} cannot be converted "
        "to <function loads at 0x…>.' when it is not valid JSON.",
        "parse_dataclass": "Human-readable numbers outside JSON strings are expanded first (where the "
        "version does so), then pydantic TypeAdapter(cls).validate_json(val); a ValidationError becomes "
        "ArgumentTypeError(repr(error)), a multi-line pydantic report.",
        "parse_reasoning_parser": "'none' in any case gives '' (unset); anything else unchanged.",
    },
    "sglang": {
        "human_readable_int": "After strip(): DIGITS[.DIGITS] with an SI suffix k, M, G, T (decimals allowed) "
        "or an IEC suffix Ki, Mi, Gi, Ti (integers only: ArgumentTypeError 'Decimals are not allowed with IEC "
        "suffixes like ...'); case-sensitive; else int(value), and a failure is ArgumentTypeError "
        "\"Invalid integer value: '...'. Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, "
        "1Mi). Suffixes are case-sensitive.\" (where the version has that text; see probes).",
        "nullable_str": "'' and 'None' give None; anything else unchanged. Never fails.",
        "json_list_type": "orjson.loads(value) (strict JSON: no NaN); a decode error is ArgumentTypeError "
        "'Invalid JSON list: {value}. Please provide a valid JSON list.' Any JSON value passes, not only lists.",
        "parse_cuda_graph_backend_arg": "Refuses 'tc_piecewise' with ArgumentTypeError 'tc_piecewise was "
        "removed; select breakable, full, or disabled'; anything else passes on to the choices check.",
        "parse_cuda_graph_config_arg": "A JSON object of phase -> settings object, phases and keys checked; "
        "each failure is an ArgumentTypeError naming --cuda-graph-config (see probes).",
    },
}


def type_note(engine, name):
    if name is None:
        return None
    base = name.split("(")[0]
    return TYPE_NOTES.get(engine, {}).get(base) or TYPE_NOTES["*"].get(base)


def argparse_type_name(conv):
    """What argparse puts in 'invalid %(type)s value' for this converter."""
    return getattr(conv, "__name__", repr(conv))


# Values tried, in order, until the real parser accepts one; the first that
# passes is the "valid value" of an option. Ordered so that the value says
# something about the converter (8k for human-readable ints, JSON for dicts).
VALID_PROBES = {
    "int": ["8", "1"],
    "float": ["0.5", "1"],
    "json": ['{"a": 1}', "{}"],
}
GENERIC_VALID = ["x", "8k", "8", "1", "a=b", "0.5", "8000", '{"a": 1}', "{}", "auto", "true", "x", "a,b", "1,2", "a:b", "1.0.0"]
INVALID_PROBES = ["not-a-value", "{oops", "-1", "1e999", "0", "99999", "true", "1k1"]


class Dumper:
    def __init__(self, engine, version):
        self.engine = engine
        self.version = version
        self.records = []
        self.types = {}
        self.pre_argv = []
        self.validate = None
        self.top = None  # the parser parse_args is called on
        self.parser = None  # the parser that owns the options (vLLM: the serve subparser)

    # -- building ----------------------------------------------------------

    def build(self):
        os.environ["COLUMNS"] = str(COLUMNS)
        os.environ.pop("LINES", None)
        # No model is loaded and nothing is fetched: the parser is all we build.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        os.environ.setdefault("DO_NOT_TRACK", "1")
        os.environ.setdefault("PYTHON_COLORS", "0")
        if self.engine == "vllm":
            os.environ["VLLM_TARGET_DEVICE"] = "cpu"
            self.build_vllm()
        else:
            self.build_sglang()
        self.hook_logging()

    def build_vllm(self):
        # `vllm serve` is the console script `vllm`: argparse takes prog from
        # argv[0]. vLLM reads the config classes' docstrings into help texts
        # only when "--help" is on the command line at import time.
        saved = sys.argv
        sys.argv = ["/usr/local/bin/vllm", "serve", "--help"]
        try:
            self.choose_vllm_platform()
            import vllm.engine.arg_utils  # noqa: F401  (reads sys.argv at import)
            import vllm.entrypoints.cli.main as cli_main

            # ... but `--model` is left out of the parser when "serve" and
            # "--help" are both on the command line while it is built.
            sys.argv = ["/usr/local/bin/vllm", "serve"]
            self.top = capture_parser(cli_main.main)
        finally:
            sys.argv = saved
        sub = next(a for a in self.top._actions if isinstance(a, argparse._SubParsersAction))
        self.parser = sub.choices["serve"]
        self.pre_argv = ["serve"]
        # `vllm serve` checks a few combinations right after parsing, before
        # anything is loaded (ServeSubcommand.validate); a failure there is a
        # traceback and exit 1.
        import vllm.entrypoints.cli.serve as serve_mod

        command = getattr(serve_mod, "ServeSubcommand", None)
        if command is not None and hasattr(command, "validate"):
            self.validate = command().validate

    def choose_vllm_platform(self):
        # The parser's defaults come from config classes that ask the current
        # platform for a device; with no GPU and a CUDA wheel, vLLM finds no
        # platform and building the parser fails. VLLM_TARGET_DEVICE=cpu makes
        # newer versions pick the CPU platform; older ones pick it only for a
        # "+cpu" build, so they are given the CPU platform here, as
        # `vllm bench` does for itself.
        from vllm import platforms

        current = platforms.current_platform
        self.platform_note = f"{type(current).__name__}, as vLLM chose it"
        if type(current).__name__ == "UnspecifiedPlatform":
            from vllm.platforms.cpu import CpuPlatform

            cpu = CpuPlatform()
            platforms._current_platform = cpu
            platforms.current_platform = cpu
            self.platform_note = "CpuPlatform, set by the generator (vLLM found no platform)"

    def build_sglang(self):
        from sglang.srt import server_args

        self.entry = server_args.prepare_server_args
        self.top = capture_parser(lambda: self.entry(["--model-path", MODEL]))
        self.parser = self.top
        self.pre_argv = []

    def hook_logging(self):
        # Records are taken as they are made, before any handler formats them,
        # so the engine's own handlers keep printing exactly as in production.
        original = logging.Logger.handle
        records = self.records

        def handle(logger, record):
            records.append(record)
            return original(logger, record)

        logging.Logger.handle = handle

    # -- running -------------------------------------------------------------

    def reset_once_caches(self):
        # vLLM logs some warnings once per process; each case is a fresh launch.
        if self.engine == "vllm":
            import vllm.logger as vl

            for value in vars(vl).values():
                if hasattr(value, "cache_clear"):
                    value.cache_clear()
            # --help=KEYWORD leaves its keyword on the class.
            cls = type(self.parser)
            if hasattr(cls, "_search_keyword"):
                cls._search_keyword = None

    def parse(self, argv, whole_entry=False):
        """argv: what follows the program name. Returns the verdict of the real parser.

        whole_entry: run the engine's entry point up to the end of parsing,
        for what it does to argv before argparse sees it (SGLang's --config).
        """
        self.reset_once_caches()
        out, err = io.StringIO(), io.StringIO()
        del self.records[:]
        result = {}
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings(
            record=True
        ) as caught:
            warnings.simplefilter("always")
            try:
                if whole_entry:
                    ns = parse_through(lambda: self.entry(list(argv)))
                else:
                    ns = self.top.parse_args(self.pre_argv + list(argv))
                result["exit"] = 0
                result["namespace"] = ns
                if self.validate is not None:
                    try:
                        self.validate(ns)
                    except Exception as e:
                        result["validate"] = f"{type(e).__name__}: {e}"
            except SystemExit as e:
                code = e.code
                result["exit"] = 0 if code is None else (code if isinstance(code, int) else 1)
                if not isinstance(code, (int, type(None))):
                    result["exit_message"] = str(code)
            except Exception as e:  # the engine raised before argparse decided: a traceback in real life
                result["exit"] = 1
                result["exception"] = f"{type(e).__name__}: {e}"
        result["stdout"] = out.getvalue()
        result["stderr"] = err.getvalue()
        result["log"] = [
            {
                "level": r.levelname,
                "logger": r.name,
                "where": f"{os.path.basename(r.pathname)}:{r.lineno}",
                "message": scrub(log_message(r)),
            }
            for r in self.records
            if r.levelno >= logging.WARNING
        ]
        result["warnings"] = [
            {
                "category": w.category.__name__,
                "message": scrub(str(w.message)),
                "file": site_relative(w.filename),
                "line": w.lineno,
                "source": (linecache_line(w.filename, w.lineno) or None),
            }
            for w in caught
        ]
        return result

    # -- describing ------------------------------------------------------------

    def all_flags(self, action):
        flags = list(action.option_strings)
        flags += [s for s, a in self.parser._option_string_actions.items() if a is action and s not in flags]
        return flags

    def note_type(self, conv):
        name = converter_name(conv)
        if name is None or name in self.types:
            return name
        entry = {
            "argparse_name": argparse_type_name(conv),
            "source": source_of(conv if not isinstance(conv, functools.partial) else conv.func),
        }
        note = type_note(self.engine, name)
        if note:
            entry["accepts"] = note
        doc = inspect.getdoc(conv) if conv not in (int, float, str, bool) else None
        if doc and not inspect.isbuiltin(conv):
            entry["doc"] = doc.split("\n\n")[0].replace("\n", " ")
        entry["invalid_value_message"] = f"invalid {entry['argparse_name']} value: %r"
        probes = {}
        for probe in ["abc", "", "1.5", "-1", "8k", "1.5K", "{oops", "{}", "[1]", "true", "none", "auto"]:
            try:
                value = conv(probe)
                probes[probe] = {"value": to_json(value)}
            except argparse.ArgumentTypeError as e:
                probes[probe] = {"argument_type_error": scrub(str(e))}
            except (TypeError, ValueError) as e:
                probes[probe] = {"invalid": scrub(f"{type(e).__name__}: {e}")}
            except Exception as e:  # argparse lets anything else through as a traceback
                probes[probe] = {"raises": scrub(f"{type(e).__name__}: {e}")}
        entry["probes"] = probes
        self.types[name] = entry
        return name

    def describe(self, action):
        help_text = action.help
        if help_text is argparse.SUPPRESS:
            first = None
        else:
            try:
                help_text = self.parser._get_formatter()._expand_help(action)
            except Exception:
                pass
            first = (help_text or "").strip().split("\n")[0] or None
        default = action.default
        d = {
            "dest": action.dest,
            "flags": list(action.option_strings),
        }
        hidden = self.all_flags(action)[len(action.option_strings) :]
        if hidden:
            d["hidden_flags"] = hidden
        d["action"] = action_name(action)
        if d["action"] not in ACTION_NAMES.values():
            d["action_base"] = action_base(action)
            d["action_class"] = f"{type(action).__module__}.{type(action).__qualname__}"
            extra = {
                k: to_json(v)
                for k, v in vars(action).items()
                if k
                not in {
                    "option_strings", "dest", "nargs", "const", "default", "type", "choices",
                    "required", "help", "metavar", "container", "deprecated",
                }
            }
            if extra:
                d["action_attrs"] = extra
        d["nargs"] = action.nargs
        if action.const is not None:
            d["const"] = to_json(action.const)
        d["type"] = self.note_type(action.type)
        if action.choices is not None:
            d["choices"] = [str(c) for c in action.choices]
            if isinstance(action.choices, (set, frozenset)):
                d["choices_unordered"] = True
            if any(not isinstance(c, str) for c in action.choices):
                d["choices_python"] = [to_json(c) for c in action.choices]
        else:
            d["choices"] = None
        d["default"] = to_json(default) if default is not argparse.SUPPRESS else "==SUPPRESS=="
        d["required"] = bool(action.required)
        d["deprecated"], how = self.deprecation(action, help_text)
        if how:
            d["deprecation"] = how
        d["metavar"] = to_json(action.metavar) if action.metavar is not None else None
        d["help"] = first
        if help_text is argparse.SUPPRESS:
            d["help_suppressed"] = True
        return d

    def deprecation(self, action, help_text):
        """Whether the option is deprecated, and how the engine says so."""
        if getattr(action, "deprecated", False):
            return True, "argparse deprecated=True: argparse prints a warning while parsing (Python 3.13+)"
        if action in getattr(self.parser, "_deprecated", ()):
            return True, (
                "vLLM deprecated=True on Python < 3.13: after parsing, if the value differs "
                "from the default, logger.warning_once(\"argument '%s' is deprecated\", dest)"
            )
        if "Deprecated" in type(action).__name__:
            return True, f"action class {type(action).__name__} warns or fails when the flag is given (at parse time)"
        # Only help that says the option itself is deprecated counts: not
        # "--allow-deprecated-quantization", "(deprecated; use mori)" about
        # one choice, or "will be deprecated".
        text = "" if help_text in (None, argparse.SUPPRESS) else str(help_text)
        own = [rf"{re.escape(s)} is deprecated" for s in action.option_strings]
        if any(re.search(p, text, re.I) for p in [r"^\W*deprecated\b", r"\bdeprecated:", r"\(deprecated,", *own]):
            return True, "help text only: the parser accepts it silently; any warning comes later, from the engine"
        return False, None

    # -- cases -------------------------------------------------------------------

    def base_argv(self):
        return [MODEL] if self.engine == "vllm" else ["--model-path", MODEL]

    def baseline(self):
        r = self.parse(self.base_argv())
        assert r["exit"] == 0, r
        return vars(r["namespace"])

    def case(self, argv, note=None, dest=None, whole_entry=False):
        r = self.parse(argv, whole_entry)
        c = {"argv": list(argv)}
        if note:
            c["note"] = note
        c["exit"] = r["exit"]
        if r["exit"] == 0 and "namespace" in r:
            ns = vars(r["namespace"])
            parsed = {}
            for k, v in ns.items():
                changed = k not in self._baseline or not safe_eq(self._baseline[k], v)
                if changed or k == dest:
                    parsed[k] = to_json(v)
            c["parsed"] = parsed
        for key in ("exception", "exit_message", "validate"):
            if key in r:
                c[key] = scrub(r[key])
        if r["stderr"]:
            stderr = scrub(r["stderr"])
            # argparse starts every error with the usage block, which for
            # SGLang is 37 kB: it is stored once at the top, and named here.
            for field, parser in (("usage", self.parser), ("top_usage", self.top)):
                block = parser.format_usage()
                if stderr.startswith(block):
                    c["usage_block"] = field
                    stderr = stderr[len(block) :]
                    break
            c["stderr"] = stderr
        if r["stdout"]:
            c["stdout"] = scrub(r["stdout"])
        if r["log"]:
            c["log"] = r["log"]
        if r["warnings"]:
            c["warnings"] = r["warnings"]
        return c

    def first_passing(self, flag, candidates, want_exit):
        base = self.base_argv()
        for value in candidates:
            r = self.parse(base + [flag, value])
            if r["exit"] == want_exit and "exception" not in r:
                return value
        return None

    def valid_candidates(self, action, type_name):
        if action.choices is not None:
            return [str(c) for c in action.choices]
        cands = []
        if type_name and "human_readable" in type_name:
            cands.append("8k")
        if type_name and ("json" in type_name or "dict" in type_name):
            cands += ['{"a": 1}', "{}"]
        cands += VALID_PROBES.get(type_name, [])
        if (
            action.default not in (None, True, False)
            and action.default is not argparse.SUPPRESS
            and isinstance(action.default, (int, float, str))
        ):
            cands.append(str(action.default))
        if isinstance(action.default, (list, tuple)) and action.default:
            cands.append(str(action.default[0]))
        return cands + [c for c in GENERIC_VALID if c not in cands]

    def option_cases(self, action, described):
        cases = []
        flags = self.all_flags(action)
        dest = action.dest
        base = self.base_argv()
        takes_value = action.nargs != 0
        if not takes_value:
            values = {}
            for flag in flags:
                c = self.case(base + [flag], dest=dest)
                cases.append(c)
                if c["exit"] == 0:
                    values[flag] = c["parsed"].get(dest)
            if values:
                described["flag_values"] = values
            # A flag takes no value, and argparse says so for --flag=value.
            if flags[0].startswith("--"):
                cases.append(self.case(base + [flags[0] + "=1"], dest=dest))
            return cases
        type_name = described["type"]
        value = self.first_passing(flags[0], self.valid_candidates(action, type_name), 0)
        if value is None:
            described["no_valid_value_found"] = True
        else:
            described["example_value"] = value
            for flag in flags:
                cases.append(self.case(base + [flag, value], dest=dest))
            if action.nargs in ("+", "*") or (isinstance(action.nargs, int) and action.nargs > 1):
                n = action.nargs if isinstance(action.nargs, int) else 2
                cases.append(self.case(base + [flags[0]] + [value] * n, dest=dest))
            if flags[0].startswith("--"):
                cases.append(self.case(base + [flags[0] + "=" + value], dest=dest))
        # The value missing: the option last on the line (fine for nargs ? and *).
        cases.append(self.case(base + [flags[0]], dest=dest))
        if action.choices is not None or (type_name not in (None, "str")):
            bad = self.first_passing(flags[0], INVALID_PROBES, 2)
            if bad is not None:
                cases.append(self.case(base + [flags[0], bad], dest=dest))
        return cases

    def global_cases(self):
        base = self.base_argv()
        cases = [self.case(base, note="baseline: only what the engine requires")]
        cases.append(self.case(base + ["--no-such-flag", "1"], note="unknown flag"))
        cases.append(self.case(base + ["--no-such-flag=1"], note="unknown flag, = form"))
        cases.append(self.case(base + ["stray"], note="an extra positional"))
        longs = [s for s in self.parser._option_string_actions if s.startswith("--")]
        if self.top.allow_abbrev:
            amb = ambiguous_prefix(longs)
            if amb:
                cases.append(self.case(base + [amb, "1"], note="ambiguous abbreviation"))
            uniq = unique_abbreviation(self.parser, longs)
            if uniq:
                abbrev, action = uniq
                argv = base + [abbrev] + ([] if action.nargs == 0 else [self.example(action)])
                cases.append(self.case(argv, note="unique abbreviation", dest=action.dest))
                if action.nargs != 0:
                    cases.append(self.case(base + [abbrev + "=" + self.example(action)], note="unique abbreviation, = form", dest=action.dest))
        short = next(
            (
                a
                for s, a in self.parser._option_string_actions.items()
                if re.fullmatch(r"-[A-Za-z]{2,}", s) and a.nargs is None and a.dest in self._examples
            ),
            None,
        )
        if short is not None:
            flag = next(s for s in short.option_strings if re.fullmatch(r"-[A-Za-z]{2,}", s))
            value = self._examples[short.dest]
            cases.append(self.case(base + [flag + value], note="short flag with the value attached", dest=short.dest))
            cases.append(self.case(base + [flag + "=" + value], note="short flag, = form", dest=short.dest))
            cases.append(self.case(base + [flag[:2], value], note="prefix of a multi-letter short flag", dest=short.dest))
        cases.append(self.case(base + ["-"], note="a lone dash is a positional"))
        cases.append(self.case(base + ["--"], note="end of options"))
        cases.append(self.case(base + ["--", "--port"], note="after --, a flag is a positional"))
        port = self.parser._option_string_actions.get("--port")
        if port is not None:
            cases.append(self.case(base + ["--port", "8000", "--port", "8001"], note="repeated option: last wins"))
            cases.append(self.case(base + ["--port", "-1"], note="negative number as a value"))
            cases.append(self.case(base + ["--port", "--host", "h"], note="a flag where a value belongs"))
            cases.append(self.case(base + ["--port="], note="empty value in = form"))
        if self.engine == "vllm":
            cases += self.vllm_cases()
        else:
            cases += self.sglang_cases()
        return cases

    def underscore_spelling(self):
        """Whether --a_b reaches the parser as --a-b: tried on a real option."""
        for s, action in self.parser._option_string_actions.items():
            if s.startswith("--") and "-" in s[2:] and action.nargs is None and action.dest in self._examples:
                r = self.parse(self.base_argv() + [s.replace("-", "_").replace("__", "--", 1), self._examples[action.dest]])
                return r["exit"] == 0
        return None

    def example(self, action):
        return getattr(self, "_examples", {}).get(action.dest, "1")

    def vllm_cases(self):
        cases = []
        cases.append(self.case([], note="no model given: vllm serve falls back to its default model"))
        cases.append(self.case(["--max_model_len", "8k"], note="underscore spelling", dest="max_model_len"))
        cases.append(self.case([MODEL, "--max_model_len=8k"], note="underscore spelling, = form", dest="max_model_len"))
        cases.append(self.case([MODEL, "--max-model-len=8k"], note="= form", dest="max_model_len"))
        cases.append(self.case(["--model", MODEL], note="--model instead of the positional"))
        cases.append(self.case(["--model=" + MODEL, "--port", "8000"], note="--model= instead of the positional"))
        cases.append(self.case(["--served-model-name", "m"], note="--served-model-name without a positional model"))
        cases.append(self.case([MODEL, "--task", "embed"], note="--task (deprecated in older versions; newer ones refuse it with a hint)"))
        cases.append(self.case([MODEL, "-O3"], note="-O<level> without a space (rewritten before parsing: --optimization-level, or -O.level in older versions)"))
        cases.append(self.case([MODEL, "-O", "3"], note="-O <level>"))
        cases.append(self.case([MODEL, "-O=2"], note="-O=<level>"))
        cases.append(self.case([MODEL, "-Odecode"], note="-O<non-digit>"))
        cases.append(self.case([MODEL, "--compilation-config.mode", "3"], note="dotted JSON key"))
        cases.append(self.case([MODEL, "-cc.mode=3"], note="dotted JSON key on a short flag"))
        cases.append(self.case([MODEL, "--compilation-config.custom_ops+", "+rms_norm"], note="dotted key with + appends"))
        cases.append(self.case([MODEL, "--max-model-len", "8K"], note="binary suffix"))
        cases.append(self.case([MODEL, "--max-model-len", "1.5K"], note="decimal with a binary suffix"))
        cases.append(self.case([MODEL, "--max-model-len", "25.6k"], note="decimal with a decimal suffix"))
        cases.append(self.case([MODEL, "--max-model-len", "auto"], note="auto"))
        cases.append(self.case([MODEL, "--max-model-len", "-1"], note="-1"))
        cases.append(self.case([MODEL, "--config"], note="--config without a file"))
        cases.append(self.case([MODEL, "--config", "/nonexistent/c.json"], note="--config with a non-yaml file"))
        cases.append(self.case([MODEL, "--config", "/nonexistent/c.yaml"], note="--config with a missing yaml file"))
        cases.append(self.case([MODEL, MODEL], note="two positionals"))
        cases.append(self.case([MODEL, "--help"], note="--help: the short, grouped help of vllm serve"))
        cases.append(self.case([MODEL, "--help=max-model"], note="--help=KEYWORD: options whose name holds it"))
        cases.append(self.case([MODEL, "--help=nothing-matches"], note="--help=KEYWORD without a match"))
        cases.append(self.case([MODEL, "--gpu-memory-utilization", "-0.5"], note="a value starting with - and holding a dot"))
        cases.append(self.case([MODEL, "--compilation-config.mode"], note="dotted key without a value"))
        cases.append(self.case([MODEL, "--no-such.key", "1"], note="dotted key of an unknown flag"))
        configs = write_config_files()
        for name, note in [
            ("flat.yaml", "--config: flat yaml (true adds the flag, false adds --no-<key> when that exists)"),
            ("nested.yaml", "--config: a nested mapping becomes a JSON value"),
            ("list.yaml", "--config: a list becomes several values"),
        ]:
            cases.append(self.case([MODEL, "--config", configs[name]], note=note))
        cases.append(self.case([MODEL, "--config", configs["flat.yaml"], "--port", "9000"], note="--config: the command line wins"))
        cases.append(self.case(["--config", configs["model.yaml"]], note="--config: model from the file"))
        cases.append(self.case(["--config", configs["flat.yaml"]], note="--config: no model anywhere"))
        return cases

    def sglang_cases(self):
        cases = []
        cases.append(self.case([], note="--model-path missing"))
        cases.append(self.case(["--model-path", MODEL, "--max-model-len", "8192"], note="a vLLM flag"))
        cases.append(self.case(["--model-path", MODEL, "--max_total_tokens", "8192"], note="underscore spelling"))
        cases.append(self.case([MODEL], note="positional model (sglang serve moves it to --model-path before parsing; the parser alone refuses it)"))
        cases.append(self.case(["--model", MODEL], note="--model alias", dest="model_path"))
        configs = write_config_files()
        whole = dict(whole_entry=True)
        for name, note in [
            ("sglang.yaml", "--config: flat yaml (true adds the flag, false leaves it out)"),
            ("nested.yaml", "--config: a nested mapping becomes a JSON value"),
            ("sglang-list.yaml", "--config: a list becomes several values"),
            ("sglang-underscore.yaml", "--config: a key is turned into --KEY as written"),
            ("sglang-unsupported.yaml", "--config: a key of an action other than store/store_true"),
        ]:
            cases.append(self.case(["--model-path", MODEL, "--config", configs[name]], note=note, **whole))
        cases.append(self.case(["--model-path", MODEL, "--config", configs["sglang.yaml"], "--port", "9000"], note="--config: the command line wins", **whole))
        cases.append(self.case(["--config", configs["sglang-model.yaml"]], note="--config: model from the file", **whole))
        cases.append(self.case(["--model-path", MODEL, "--config"], note="--config without a file", **whole))
        cases.append(self.case(["--model-path", MODEL, "--config", "/nonexistent/c.json"], note="--config with a non-yaml file", **whole))
        cases.append(self.case(["--model-path", MODEL, "--config", "/nonexistent/c.yaml"], note="--config with a missing yaml file", **whole))
        return cases

    # -- everything ------------------------------------------------------------

    def dump(self):
        self.build()
        self._baseline = self.baseline()
        options, positionals, cases = [], [], []
        self._examples = {}
        for action in self.parser._actions:
            described = self.describe(action)
            if not action.option_strings:
                described.pop("flags")
                positionals.append(described)
                continue
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                options.append(described)
                continue
            option_cases = self.option_cases(action, described)
            if "example_value" in described:
                self._examples[action.dest] = described["example_value"]
            options.append(described)
            cases += option_cases
        cases = self.global_cases() + cases
        usage = self.parser.format_usage()
        data = {
            "engine": self.engine,
            "version": self.version,
            "python": sys.version.split()[0],
            "columns": COLUMNS,
            "prog": self.parser.prog,
            "usage": strip_usage(usage),
            "allow_abbrev": self.top.allow_abbrev,
            "underscore_spelling": self.underscore_spelling(),
            "exit_on_error": self.top.exit_on_error,
            "prefix_chars": self.parser.prefix_chars,
        }
        if self.top is not self.parser:
            data["argv_prefix"] = self.pre_argv
            data["top_prog"] = self.top.prog
            data["top_usage"] = strip_usage(self.top.format_usage())
        data["stderr_note"] = (
            "a case with usage_block F printed 'usage: ' + data[F] + '\\n' + stderr; "
            "without usage_block, stderr is all it printed. Placeholders: {site-packages}/ "
            "(the engine's package dir), ~ ($HOME), {uuid}, ' at 0x…' (a memory address)"
        )
        data.update(self.engine_facts())
        data["packages"] = package_versions()
        data["types"] = dict(sorted(self.types.items()))
        data["positionals"] = positionals
        data["options"] = options
        data["cases"] = cases
        return data

    def logging_at_parse_time(self, name):
        """Where a WARNING of logger `name` goes while the parser runs."""
        handlers = []
        logger = logging.getLogger(name)
        while logger is not None:
            handlers += logger.handlers
            if not logger.propagate:
                break
            logger = logger.parent
        if not handlers:
            return (
                "no handler is set up yet: Python's last-resort handler writes the bare "
                "message and a newline to stderr (WARNING and above)"
            )
        out = []
        for h in handlers:
            stream = getattr(h, "stream", None)
            where = {id(sys.__stdout__): "stdout", id(sys.__stderr__): "stderr"}.get(id(stream), repr(stream))
            fmt = getattr(h.formatter, "_fmt", None)
            datefmt = getattr(h.formatter, "datefmt", None)
            out.append(f"{type(h).__name__} to {where}, level {logging.getLevelName(h.level)}, format {fmt!r}, date format {datefmt!r}")
        return "; ".join(out)

    def engine_facts(self):
        facts = {"logging_at_parse_time": self.logging_at_parse_time(self.engine)}
        if self.engine == "vllm":
            import vllm.logger as vl

            facts["platform"] = self.platform_note
            facts["log_format_once_configured"] = getattr(vl, "_FORMAT", None)
            facts["log_date_format_once_configured"] = getattr(vl, "_DATE_FORMAT", None)
            facts["argv_note"] = (
                "case argv is what follows `vllm serve`; the top-level `vllm` parser's "
                "parse_args was called with argv_prefix + argv"
            )
        else:
            facts["argv_note"] = (
                "case argv is what `prepare_server_args` gets: what follows `sglang serve` "
                "(after it turns a leading positional model into --model-path and takes out "
                "--model-type) or `python -m sglang.launch_server`"
            )
        return facts


CONFIG_DIR = "/tmp/llmgw-engine-options"
CONFIG_FILES = {
    "flat.yaml": "port: 8001\nmax-model-len: 8k\nenforce-eager: true\nenable-prefix-caching: false\ntrust-remote-code: false\n",
    "nested.yaml": "compilation-config:\n  mode: 3\nport: 8002\n",
    "list.yaml": "served-model-name:\n  - a\n  - b\n",
    "model.yaml": "model: /models/m\nport: 8003\n",
    "sglang.yaml": "port: 8001\ntp-size: 2\ntrust-remote-code: true\nskip-server-warmup: false\n",
    "sglang-underscore.yaml": "trust_remote_code: true\n",
    "sglang-list.yaml": "gc-threshold:\n  - 1\n  - 2\n",
    "sglang-unsupported.yaml": "lora-paths:\n  - a=/l/a\n",
    "sglang-model.yaml": "model-path: /models/m\nport: 8003\n",
}


def write_config_files():
    """Config files at fixed paths, so the cases that name them stay the same run to run."""
    os.makedirs(CONFIG_DIR, exist_ok=True)
    paths = {}
    for name, text in CONFIG_FILES.items():
        path = os.path.join(CONFIG_DIR, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        paths[name] = path
    return paths


def linecache_line(filename, lineno):
    return linecache.getline(filename, lineno).strip()


def safe_eq(a, b):
    try:
        return bool(a == b)
    except Exception:
        return a is b


def log_message(record):
    try:
        return record.getMessage()
    except Exception:
        return str(record.msg)


def strip_usage(text):
    text = text.rstrip("\n")
    return text[len("usage: ") :] if text.startswith("usage: ") else text


def ambiguous_prefix(longs):
    """The shortest-but-informative prefix of two long options that is no option itself."""
    best = None
    for i, a in enumerate(longs):
        for b in longs[i + 1 :]:
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            prefix = a[:n]
            if len(prefix) >= 5 and prefix not in longs:
                if best is None or len(prefix) > len(best):
                    best = prefix
    return best


def unique_abbreviation(parser, longs):
    for s in longs:
        action = parser._option_string_actions[s]
        if len(s) < 8 or action.nargs not in (None, 0):
            continue
        abbrev = s[:-2]
        matches = {parser._option_string_actions[o] for o in longs if o.startswith(abbrev)}
        if abbrev not in longs and len(matches) == 1:
            return abbrev, action
    return None


def package_versions():
    from importlib import metadata

    wanted = ["torch", "transformers", "pydantic", "fastapi", "openai", "huggingface-hub", "tokenizers", "numpy"]
    out = {}
    for name in wanted:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def write_json(data, path):
    """Pretty where it helps a diff: one option, one case, one type per line."""

    def one(v):
        return json.dumps(v, ensure_ascii=False, sort_keys=False)

    lines = ["{"]
    items = list(data.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
            lines.append(f"  {one(key)}: [")
            for j, x in enumerate(value):
                lines.append(f"    {one(x)}{',' if j < len(value) - 1 else ''}")
            lines.append(f"  ]{comma}")
        elif isinstance(value, dict) and value and key == "types":
            lines.append(f"  {one(key)}: {{")
            sub = list(value.items())
            for j, (k, v) in enumerate(sub):
                lines.append(f"    {one(k)}: {one(v)}{',' if j < len(sub) - 1 else ''}")
            lines.append(f"  }}{comma}")
        else:
            lines.append(f"  {one(key)}: {one(value)}{comma}")
    lines.append("}")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("requirements")
    r.add_argument("wheel")
    d = sub.add_parser("dump")
    d.add_argument("--engine", required=True, choices=["vllm", "sglang"])
    d.add_argument("--version", required=True)
    d.add_argument("--out", required=True)
    u = sub.add_parser("unavailable")
    u.add_argument("--file", required=True)
    u.add_argument("--engine", required=True)
    u.add_argument("--version", required=True)
    u.add_argument("--reason")
    u.add_argument("--clear", action="store_true")
    args = ap.parse_args()
    if args.cmd == "requirements":
        cmd_requirements(args.wheel)
    elif args.cmd == "unavailable":
        cmd_unavailable(args.file, args.engine, args.version, args.reason or "", args.clear)
    else:
        from importlib import metadata

        installed = metadata.version(args.engine)
        if installed != args.version:
            raise SystemExit(f"this venv holds {args.engine} {installed}, not {args.version}")
        data = Dumper(args.engine, args.version).dump()
        write_json(data, args.out)
        print(
            f"{args.engine} {args.version}: {len(data['options'])} options, {len(data['cases'])} cases",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
