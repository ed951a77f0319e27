#!/usr/bin/env python3
"""Encode KV-cache event fixtures with the engines' own classes.

vLLM (`vllm/distributed/kv_events.py`) and SGLang
(`sglang/srt/disaggregation/kv_events.py`) publish KV-cache events over ZMQ
when started with `--kv-events-config`. This script loads those modules' real
source from unpacked wheels, with small stand-ins in `sys.modules` for the
heavy imports that have nothing to do with the wire format (logger, config
decorator, network helpers, the parallel-state getter). The event structs, the
msgspec encoder and the `ZmqEventPublisher` are the wheel's own code.

Writes, for each shape (vllm-0.11, vllm-0.34, sglang-0.5.23):

  crates/kv-events/tests/fixtures/<shape>.json      one batch per case
  crates/kv-events/tests/fixtures/<shape>-zmq.json  frames from a live run
                                                     of the real publisher
and crates/kv-events/tests/fixtures/vllm-block-hash.json (vLLM prefix-cache
block hashes computed with the wheels' own hash functions).

Usage (see README.md for the pip commands):

  /tmp/kvvenv/bin/python scripts/kv-events/encode_fixtures.py \
      --vllm-011 /tmp/kvwheels/v011 --vllm-034 /tmp/kvwheels/v034 \
      --sglang /tmp/kvwheels/sgl [--no-zmq] [--out DIR]

The directories may also come from KV_VLLM_011, KV_VLLM_034 and KV_SGLANG.
"""

from __future__ import annotations

import __future__
import argparse
import ast
import atexit
import dataclasses
import enum
import hashlib
import importlib.util
import json
import logging
import os
import pickle
import random
import socket
import sys
import time
import types
import typing
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import zmq

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "crates" / "kv-events" / "tests" / "fixtures"

# Timestamps that are exact in binary floating point, so any JSON float parser
# reads back the same f64 that msgspec wrote.
TS = [1750000000.5, 1750000001.25, 1750000002.75, 1750000003.125,
      1750000004.0625, 1750000005.5, 1750000006.25, 1750000007.75,
      1750000008.5, 1750000009.25, 1750000010.5, 1750000011.75,
      1750000012.125, 1750000013.5]

# Hash values that exercise every msgpack integer width.
H_FIX = 42                        # positive fixint
H_U32 = 0xDEADBEEF                # uint32
H_I64 = 0x0123456789ABCDEF        # fits i64, encoded as uint64
H_U64 = 0xFEDCBA9876543210        # >= 2**63: only fits u64
H_MAX = 2**64 - 1
TOKENS48 = [1, 127, 128, 255, 256, 65535, 65536, 151643] + list(range(1000, 1040))
TOKENS32 = list(range(2000, 2032))


# ---------------------------------------------------------------- loading ---

def purge_engine_modules() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in ("vllm", "sglang"):
            del sys.modules[name]


def stub(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    mod.__dict__["__kv_fixture_stub__"] = True
    sys.modules[name] = mod
    return mod


def package(name: str) -> types.ModuleType:
    mod = stub(name)
    mod.__path__ = []  # importable as a package; submodules come from sys.modules
    return mod


def load_real(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader, path
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def exec_real_defs(path: Path, names: list[str], ns: dict) -> dict:
    """Execute only the top-level definitions of `names` from a real file.

    Used for modules too heavy to import whole (they pull in torch): the
    function bodies and constants are the wheel's own text, compiled as is.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    picked, found = [], set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            node_names = {node.name}
        elif isinstance(node, ast.Assign):
            node_names = {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            node_names = {node.target.id}
        else:
            continue
        if node_names & set(names):
            picked.append(node)
            found |= node_names
    missing = set(names) - found
    if missing:
        raise SystemExit(f"{path}: definitions not found: {sorted(missing)}")
    code = compile(ast.Module(body=picked, type_ignores=[]), str(path), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, ns)
    return ns


class _Envs:
    """vllm.envs stand-in: the one variable the event code reads, parsed the
    same way vllm/envs.py does."""

    @property
    def VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES(self) -> bool:  # noqa: N802
        return bool(int(os.getenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")))


def _vllm_config_decorator(real_utils_src: str):
    """vllm.config.utils.config stand-in, matching the wheel's own."""
    if 'extra="forbid"' in real_utils_src:
        from pydantic import ConfigDict
        from pydantic.dataclasses import dataclass as pyd_dataclass

        def config(cls=None, *, config=None, **kwargs):
            merged = ConfigDict(extra="forbid")
            if config is not None:
                merged.update(config)

            def deco(c):
                return pyd_dataclass(c, config=merged, **kwargs)
            return deco if cls is None else deco(cls)
        return config
    return lambda cls: cls  # 0.11: the decorator only returns the class


def _split_zmq_path(path: str):
    scheme, rest = path.split("://", 1)
    host, _, port = rest.rpartition(":")
    return scheme, host.strip("[]"), port


def load_vllm(root: Path) -> dict:
    purge_engine_modules()
    for p in ("vllm", "vllm.config", "vllm.distributed", "vllm.v1",
              "vllm.v1.core", "vllm.utils"):
        package(p)
    envs = _Envs()
    sys.modules["vllm"].envs = envs
    stub("vllm.logger", init_logger=logging.getLogger)
    stub("vllm.config.utils",
         config=_vllm_config_decorator((root / "vllm/config/utils.py").read_text()))
    # Only used for the tcp://*:0 bind path, which the fixtures do not take.
    stub("vllm.utils.network_utils",
         get_ip=lambda: "127.0.0.1",
         get_tcp_uri=lambda ip, port: f"tcp://{ip}:{port}",
         is_valid_ipv6_address=lambda a: ":" in a,
         split_zmq_path=_split_zmq_path)

    # Hash functions: 0.34 has them in their own light module; 0.11 keeps them
    # in vllm/utils/__init__.py, which imports torch, so take just the defs.
    hashing_path = root / "vllm/utils/hashing.py"
    if hashing_path.exists():
        hashing = load_real("vllm.utils.hashing", hashing_path)
        hash_ns = vars(hashing)
    else:
        import cbor2
        hash_ns = exec_real_defs(root / "vllm/utils/__init__.py",
                                 ["sha256", "sha256_cbor", "get_hash_fn_by_name"],
                                 {"hashlib": hashlib, "pickle": pickle, "cbor2": cbor2,
                                  "Any": Any})

    # kv_cache_utils imports the model config and torch; take the hash types,
    # the wire conversion and the NONE_HASH / chaining functions from it.
    kvcu_path = root / "vllm/v1/core/kv_cache_utils.py"
    kvcu_src = kvcu_path.read_text()
    ns: dict = {"os": os, "hashlib": hashlib, "envs": envs, "typing": typing,
                "Union": typing.Union, "Optional": typing.Optional,
                "NewType": typing.NewType, "TypeAlias": typing.TypeAlias,
                "Any": Any, "logger": logging.getLogger("vllm.v1.core.kv_cache_utils")}
    ns.update({k: hash_ns[k] for k in ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
               if k in hash_ns})
    names = ["BlockHash", "ExternalBlockHash", "maybe_convert_block_hash",
             "NONE_HASH", "init_none_hash", "hash_block_tokens"]
    for extra in ("DEFAULT_NONE_HASH_SEED", "_NON_CRYPTO_HASH_FUNCTIONS",
                  "_NONE_HASH_SEED", "resolve_none_hash_seed", "get_none_hash_seed"):
        if f"\n{extra}" in kvcu_src or f"\ndef {extra}(" in kvcu_src:
            names.append(extra)
    exec_real_defs(kvcu_path, names, ns)
    kvcu = stub("vllm.v1.core.kv_cache_utils",
                **{k: ns[k] for k in names if k in ns})

    cfg = load_real("vllm.config.kv_events", root / "vllm/config/kv_events.py")
    kv = load_real("vllm.distributed.kv_events", root / "vllm/distributed/kv_events.py")
    return {"kv": kv, "cfg": cfg, "kvcu_ns": ns, "hash_ns": hash_ns, "kvcu": kvcu}


@dataclasses.dataclass
class _Parallel:
    pp_rank: int = 0
    attn_tp_rank: int = 0
    attn_cp_rank: int = 0
    attn_dp_size: int = 1
    attn_dp_rank: int = 0
    dp_rank: int | None = None


def load_sglang(root: Path) -> dict:
    purge_engine_modules()
    for p in ("sglang", "sglang.srt", "sglang.srt.disaggregation",
              "sglang.srt.utils", "sglang.srt.mem_cache"):
        package(p)
    # runtime_context builds the whole server state; kv_events only reads
    # get_parallel() to decide whether this rank publishes.
    stub("sglang.srt.runtime_context", get_parallel=lambda: _Parallel())
    load_real("sglang.srt.utils.network", root / "sglang/srt/utils/network.py")
    kv = load_real("sglang.srt.disaggregation.kv_events",
                   root / "sglang/srt/disaggregation/kv_events.py")
    mc = exec_real_defs(root / "sglang/srt/mem_cache/utils.py", ["hash_str_to_int64"], {})
    return {"kv": kv, "hash_str_to_int64": mc["hash_str_to_int64"]}


# --------------------------------------------------------------- to JSON ---

def jsonable(v: Any) -> Any:
    if isinstance(v, enum.Enum):
        return jsonable(v.value)
    if isinstance(v, (bytes, bytearray)):
        return {"$bytes": bytes(v).hex()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, msgspec.Struct):
        return struct_json(v)
    return v


def struct_json(s: msgspec.Struct) -> dict:
    cfg = s.__struct_config__
    out: dict = {}
    if cfg.tag is not None:
        out[cfg.tag_field] = cfg.tag
    for f in s.__struct_fields__:
        out[f] = jsonable(getattr(s, f))
    return out


def wire_json(payload: bytes) -> Any:
    """The payload decoded generically (no schema): arrays stay arrays, maps
    stay maps, msgpack bin becomes {"$bytes": hex}."""
    return jsonable(msgpack.unpackb(payload, raw=False, strict_map_key=False))


def batch_expect(batch: msgspec.Struct, dp_field: str) -> dict:
    return {
        "ts": batch.ts,
        "dp_rank": getattr(batch, dp_field),
        "events": [struct_json(e) for e in batch.events],
    }


def describe_struct(cls) -> dict:
    cfg = cls.__struct_config__
    hints = typing.get_type_hints(cls)
    defaults = dict(zip(cls.__struct_fields__[len(cls.__struct_fields__)
                                              - len(cls.__struct_defaults__):],
                        cls.__struct_defaults__))
    fields = []
    for f in cls.__struct_fields__:
        d = {"name": f, "type": repr(hints.get(f)).replace("typing.", "")}
        if f in defaults:
            d["default"] = repr(defaults[f])
        else:
            d["required"] = True
        fields.append(d)
    return {"class": cls.__name__, "array_like": cfg.array_like,
            "omit_defaults": cfg.omit_defaults, "tag_field": cfg.tag_field,
            "tag": cfg.tag, "fields": fields}


# ---------------------------------------------------------------- cases ---

def make_case(name: str, batch, kv, dp_field: str, notes: str,
              extra: dict | None = None) -> dict:
    payload = msgspec.msgpack.Encoder().encode(batch)  # the publisher's encoder
    case = {"name": name, "notes": notes, "payload_hex": payload.hex(),
            "expect": batch_expect(batch, dp_field), "wire": wire_json(payload)}
    # Round trip through the engine's own typed decoder (what a Python consumer
    # using these classes would do).
    try:
        back = msgspec.msgpack.decode(payload, type=kv.KVEventBatch)
        assert msgspec.msgpack.encode(back) == payload, name
        case["engine_typed_decode"] = "ok"
    except msgspec.ValidationError as e:
        case["engine_typed_decode"] = f"ValidationError: {e}"
    if extra:
        case.update(extra)
    return case


def vllm_cases(kv, version: str) -> list[dict]:
    B = kv.BlockStored
    R = kv.BlockRemoved
    C = kv.AllBlocksCleared
    KB = kv.KVEventBatch
    fields = set(B.__struct_fields__)
    new = "lora_name" in fields   # 0.34-style

    def stored(**kw):
        base = dict(block_hashes=[H_I64, H_U64, H_FIX], parent_block_hash=None,
                    token_ids=TOKENS48, block_size=16, lora_id=None, medium="GPU")
        if new:
            base["lora_name"] = None
        base.update(kw)
        return B(**base)

    def batch(ts, events, dp=0):
        return KB(ts=ts, events=events, data_parallel_rank=dp)

    cases = []
    add = lambda n, b, notes, **x: cases.append(make_case(n, b, kv, "data_parallel_rank", notes, x or None))

    add("stored_first_blocks", batch(TS[0], [stored()]),
        "BlockStored for the first 3 blocks of a prompt: int hashes (default "
        "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), no parent, no LoRA, GPU, dp rank 0 "
        "as filled in by ZmqEventPublisher.publish.")
    add("stored_with_parent_and_lora",
        batch(TS[1], [stored(block_hashes=[H_U32, H_MAX], parent_block_hash=H_U64,
                             token_ids=TOKENS32, lora_id=7,
                             **({"lora_name": "sql-adapter"} if new else {}))]),
        "BlockStored continuing a chain (parent set) for a LoRA request.")
    if new:
        add("stored_typical_0_34",
            batch(TS[2], [stored(group_idx=0, kv_cache_spec_kind="full_attention")]),
            "What 0.34's BlockPool + KVCacheManager emit for a plain request: "
            "group_idx=0 and kv_cache_spec_kind are set, the rest default.")
        add("stored_all_fields",
            batch(TS[3], [stored(
                block_hashes=[H_I64, H_U64], parent_block_hash=H_FIX,
                token_ids=TOKENS32, lora_id=3, medium="CPU", lora_name="sql-adapter",
                extra_keys=[("sql-adapter", ("mm-3f9a", 5), "salt-1"),
                            None],
                group_idx=1, kv_cache_spec_kind="sliding_window",
                kv_cache_spec_sliding_window=4096, locality="LOCAL",
                ownership="kvcr", session_id="sess-42",
                lookahead_token_ids=[[7, 8], [9, 10]])]),
            "Every optional BlockStored field set. extra_keys: one entry per block, "
            "each a tuple (msgpack array) of untagged keys - LoRA name (str), "
            "(mm_identifier, offset) pair (array), cache_salt (str) - or nil.")
        add("stored_extra_keys_prompt_embeds",
            batch(TS[4], [stored(block_hashes=[H_I64], token_ids=TOKENS48[:16],
                                 extra_keys=[(hashlib.sha256(b"embeds").digest(),)],
                                 group_idx=0)]),
            "extra_keys entry carrying a prompt-embeds digest: 32 raw bytes (msgpack bin).")
    add("removed", batch(TS[5], [R(block_hashes=[H_I64, H_U64], medium="GPU")]),
        "BlockRemoved, GPU.")
    if new:
        add("removed_all_fields",
            batch(TS[6], [R(block_hashes=[H_U32], medium="STORAGE", group_idx=2,
                            locality="REMOTE", ownership="kvcr")]),
            "BlockRemoved with every optional field set.")
        add("removed_group_idx_only",
            batch(TS[7], [R(block_hashes=[H_I64], medium="GPU", group_idx=0)]),
            "What 0.34's BlockPool emits on eviction: group_idx set (0 is not the "
            "default None, so it is on the wire).")
    add("cleared", batch(TS[8], [C()]), "AllBlocksCleared (reset_prefix_cache).")
    mixed = [stored(block_hashes=[H_FIX, H_U32], token_ids=TOKENS32),
             R(block_hashes=[H_FIX], medium="GPU"), C(),
             stored(block_hashes=[H_I64], parent_block_hash=None,
                    token_ids=TOKENS48[:16], lora_id=1, medium=None,
                    **({"lora_name": "a", "group_idx": 0} if new else {}))]
    add("mixed", batch(TS[9], mixed, dp=3),
        "All three event types in one batch, data_parallel_rank 3, one BlockStored "
        "with medium None.")
    add("bytes_hashes",
        batch(TS[10], [stored(block_hashes=[hashlib.sha256(b"b0").digest(),
                                            hashlib.sha256(b"b1").digest()],
                              parent_block_hash=hashlib.sha256(b"p").digest(),
                              token_ids=TOKENS32),
                       R(block_hashes=[hashlib.sha256(b"b0").digest()], medium="GPU")]),
        "ExternalBlockHash = bytes | int: with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 "
        "the raw 32-byte sha256 block hashes go out as msgpack bin.")
    add("offload_cpu_medium",
        batch(TS[11], [stored(medium="CPU", block_hashes=[H_I64]),
                       R(block_hashes=[H_I64], medium="CPU"),
                       R(block_hashes=[H_U64], medium=None)]),
        "Medium values from the offloading connector ('CPU'; 0.34 also 'STORAGE') "
        "and medium None.")
    add("no_dp_rank", KB(ts=TS[12], events=[C()]),
        "data_parallel_rank None: still a 3-element batch array with nil last "
        "(msgspec does not drop fields of array_like structs, omit_defaults or "
        "not). ZmqEventPublisher never sends this (publish() fills in its rank).")
    add("empty_events", batch(TS[13], []),
        "A batch with no events (the scheduler never publishes one; decoder "
        "robustness only).")
    return cases


def sglang_cases(sg: dict) -> list[dict]:
    kv = sg["kv"]
    B, R, C, KB, M = (kv.BlockStored, kv.BlockRemoved, kv.AllBlocksCleared,
                      kv.KVEventBatch, kv.StorageMedium)
    h64 = sg["hash_str_to_int64"]
    neg = -0x0123456789ABCDEF
    i64min, i64max = -2**63, 2**63 - 1

    def batch(ts, events, dp=0):
        return KB(ts=ts, events=events, attn_dp_rank=dp)

    cases = []
    add = lambda n, b, notes, **x: cases.append(make_case(n, b, kv, "attn_dp_rank", notes, x or None))

    add("stored_first_blocks",
        batch(TS[0], [B(block_hashes=[H_I64, neg, i64min], parent_block_hash=None,
                        token_ids=TOKENS48, block_size=16, lora_id=None,
                        medium=M.GPU)]),
        "Coalesced BlockStored (3 pages of 16, so 48 tokens; block_size stays the "
        "page size), no parent, medium StorageMedium.GPU (a str enum; encodes as "
        "'GPU'). SGLang hashes are signed int64.")
    add("stored_with_parent_and_lora",
        batch(TS[1], [B(block_hashes=[i64max, -1], parent_block_hash=neg,
                        token_ids=TOKENS32, block_size=16, lora_id=5, medium=M.GPU)]),
        "Parent set, lora_id set, negative hashes.")
    seed = kv.kv_event_namespace_seed(extra_key="x" * 32, cache_salt="salt-1")
    raw_hex = [hashlib.sha256(bytes([i])).hexdigest() for i in range(3)]
    raw = [h64(h) for h in raw_hex]
    named = [kv.namespaced_block_hash(h, namespace_seed=seed) for h in raw]
    add("stored_all_fields",
        batch(TS[2], [B(block_hashes=named[1:], parent_block_hash=named[0],
                        token_ids=TOKENS32, block_size=16, lora_id=None,
                        medium=M.CPU, cache_salt="salt-1", session_id="sess-42",
                        lora_name="sql-adapter")]),
        "Every optional field set (medium CPU_PINNED, cache_salt, session_id, "
        "lora_name), hashes namespaced as in format='dynamo'.",
        derivation={
            "hash_hex": raw_hex,
            "hash_str_to_int64": raw,
            "extra_key": "x" * 32, "cache_salt": "salt-1",
            "namespace_seed_hex": seed.hex(),
            "namespaced": named,
            "rule": "int64 = first 16 hex chars of the sha256 hex as signed big-endian; "
                    "namespaced = signed big-endian int64 of sha256(seed + "
                    "int64.to_bytes(8,'big',signed=True))[:8]; seed = "
                    "sha256(b'sglang-kv-event-namespace-v1' + per part (extra_key, "
                    "cache_salt): b'\\x00' if None else b'\\x01' + len(utf8) as 8 "
                    "bytes little-endian + utf8)",
        })
    add("stored_medium_values",
        batch(TS[3], [B(block_hashes=[H_FIX], parent_block_hash=None,
                        token_ids=TOKENS48[:16], block_size=16, lora_id=None,
                        medium=m) for m in (M.DISK, M.EXTERNAL)]
              + [B(block_hashes=[H_U32], parent_block_hash=None,
                   token_ids=TOKENS48[:16], block_size=16, lora_id=None)]),
        "medium DISK and EXTERNAL, and medium left at its default None (omitted).")
    add("stored_bigram_tokens",
        batch(TS[4], [B(block_hashes=[H_I64], parent_block_hash=None,
                        token_ids=[(TOKENS32[i], TOKENS32[i + 1]) for i in range(4)],
                        block_size=4, lora_id=None, medium=M.GPU)]),
        "EAGLE bigram radix cache: token_ids are 2-element arrays "
        "(record_store keeps 'historical event payload').")
    add("removed", batch(TS[5], [R(block_hashes=[H_I64, neg], medium=M.GPU)]),
        "BlockRemoved, GPU.")
    add("removed_default_medium", batch(TS[6], [R(block_hashes=[i64max])]),
        "BlockRemoved with medium None (omitted).")
    add("cleared", batch(TS[7], [C()]), "AllBlocksCleared.")
    add("mixed",
        batch(TS[8], [B(block_hashes=[H_FIX, H_U32], parent_block_hash=None,
                        token_ids=TOKENS32, block_size=16, lora_id=None, medium=M.GPU),
                      R(block_hashes=[H_FIX], medium=M.CPU), C()], dp=3),
        "All three event types, attn_dp_rank 3.")
    add("no_dp_rank", KB(ts=TS[9], events=[C()]),
        "attn_dp_rank None: EventBatch has no omit_defaults, so it is encoded as "
        "nil and the batch stays a 3-element array. (publish() fills in the rank.)")
    add("empty_events", batch(TS[10], []), "A batch with no events (robustness).")
    return cases


# ------------------------------------------------------------------ ZMQ ---

_RND = random.SystemRandom()


def free_port_pair(avoid: tuple[int, ...] = ()) -> int:
    rnd = _RND
    for _ in range(200):
        base = rnd.randrange(20000, 40000)
        ok = base not in avoid and base + 1 not in avoid
        for p in (base, base + 1):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                ok = False
            finally:
                s.close()
        if ok:
            return base
    raise RuntimeError("no free loopback ports")


def recv_all(sock: zmq.Socket, timeout_ms: int, stop=None,
             count: int | None = None) -> list[list[bytes]]:
    msgs = []
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        left = int((deadline - time.monotonic()) * 1000)
        if left <= 0 or not sock.poll(left):
            return msgs
        msg = sock.recv_multipart()
        msgs.append(msg)
        if (stop and stop(msg)) or (count is not None and len(msgs) >= count):
            return msgs


def capture_zmq(shape: str, kv, dp_field: str, batches: list, vllm: bool) -> dict:
    ctx = zmq.Context.instance()
    base = free_port_pair()
    rbase = free_port_pair(avoid=(base - 1, base, base + 1))
    dp_rank = 1
    topic = "kv"
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    if vllm:
        # vLLM binds only endpoints with '*', '::', ipc:// or inproc:// (a
        # concrete host makes its PUB connect). Use the default bind style,
        # tcp://*:PORT, and connect the SUB over loopback. (A binding SUB with
        # a connecting PUB received nothing in the sandbox this was made in,
        # even with plain pyzmq sockets, so that style is not captured.)
        pub = kv.ZmqEventPublisher(data_parallel_rank=dp_rank,
                                   endpoint=f"tcp://*:{base}",
                                   replay_endpoint=f"tcp://127.0.0.1:{rbase}",
                                   buffer_steps=10_000, hwm=100_000, topic=topic)
        sub.connect(f"tcp://127.0.0.1:{base + dp_rank}")
        mode = "PUB binds tcp://*:BASE+rank, SUB connects to 127.0.0.1"
    else:
        pub = kv.ZmqEventPublisher(attn_dp_rank=dp_rank,
                                   endpoint=f"tcp://127.0.0.1:{base}", bind=True,
                                   replay_endpoint=f"tcp://127.0.0.1:{rbase}",
                                   buffer_steps=10_000, hwm=100_000, topic=topic)
        sub.connect(f"tcp://127.0.0.1:{base + dp_rank}")
        mode = "PUB binds tcp://127.0.0.1:BASE+rank (bind=true), SUB connects"
    time.sleep(0.7)  # PUB/SUB slow joiner
    for b in batches:
        pub.publish(b)
    live = recv_all(sub, 5000, count=len(batches))
    assert len(live) == len(batches), (shape, len(live))
    enc = msgspec.msgpack.Encoder()
    for msg, b in zip(live, batches):
        assert getattr(b, dp_field) == dp_rank  # filled in by publish()
        assert msg[-1] == enc.encode(b), shape

    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{rbase + dp_rank}")
    time.sleep(0.2)
    end_seq = (-1).to_bytes(8, "big", signed=True)
    is_end = lambda m: end_seq in m
    replays = []
    for start in (0, 2, 99):
        req = [b"", start.to_bytes(8, "big")]
        dealer.send_multipart(req)
        got = recv_all(dealer, 3000, stop=is_end)
        assert got and is_end(got[-1]), (shape, got)
        replays.append({"start_seq": start,
                        "request_frames_hex": [f.hex() for f in req],
                        "reply_messages": [{"frames_hex": [f.hex() for f in m]}
                                           for m in got]})
    bad = [b"", (0).to_bytes(8, "big"), b"extra"]
    dealer.send_multipart(bad)
    bad_reply = recv_all(dealer, 800)
    dealer.close(linger=0)
    pub.shutdown()
    atexit.unregister(pub.shutdown)  # SGLang registers it; once is enough
    sub.close(linger=0)

    if vllm and len(replays[0]["reply_messages"][0]["frames_hex"]) == 3:
        replay_desc = ("DEALER receives [b'', seq(8 BE), payload] per buffered batch with "
                       "seq >= start, then the end marker [b'', ff*8, b''] (no topic frame).")
    else:
        replay_desc = ("DEALER receives [b'', topic, seq(8 BE), payload] per buffered batch "
                       "with seq >= start, then the end marker [b'', b'', ff*8, b''] "
                       "(empty topic frame, seq -1 as signed 8-byte BE, empty payload).")
    return {
        "shape": shape,
        "description": (
            f"Real {shape} ZmqEventPublisher on loopback, data-parallel rank {dp_rank}, "
            f"topic '{topic}'. {mode}; the ports are BASE+{dp_rank} and REPLAY_BASE+{dp_rank} "
            "(offset_endpoint_port adds the rank). Live: SUB receives 3 frames "
            "[topic utf-8, seq as 8-byte unsigned big-endian (first batch 0), msgpack "
            f"batch]; publish() set the batch's {dp_field} to {dp_rank}. Replay: the "
            "ROUTER reads [identity, b'', start_seq] (exactly 3 frames, else ignored); "
            "a DEALER client sends [b'', start_seq 8-byte BE]. " + replay_desc +
            " A request with the wrong frame count gets no reply at all."),
        "publisher_args": {"data_parallel_rank" if vllm else "attn_dp_rank": dp_rank,
                           "endpoint": "tcp://*:BASE" if vllm else "tcp://127.0.0.1:BASE",
                           **({} if vllm else {"bind": True}),
                           "replay_endpoint": "tcp://127.0.0.1:REPLAY_BASE",
                           "buffer_steps": 10000, "hwm": 100000, "topic": topic},
        "live": [{"frames_hex": [f.hex() for f in m], "seq": int.from_bytes(m[1], "big"),
                  "expect": batch_expect(b, dp_field)}
                 for m, b in zip(live, batches)],
        "replay": replays,
        "invalid_request": {"request_frames_hex": [f.hex() for f in bad],
                            "reply_messages": [[f.hex() for f in m] for m in bad_reply]},
    }


def zmq_batches_vllm(kv) -> list:
    new = "lora_name" in kv.BlockStored.__struct_fields__
    extra = {"lora_name": None, "group_idx": 0} if new else {}
    return [
        kv.KVEventBatch(ts=TS[0], events=[kv.BlockStored(
            block_hashes=[H_I64, H_U64], parent_block_hash=None, token_ids=TOKENS32,
            block_size=16, lora_id=None, medium="GPU", **extra)]),
        kv.KVEventBatch(ts=TS[1], events=[kv.BlockRemoved(block_hashes=[H_I64],
                                                          medium="GPU")]),
        kv.KVEventBatch(ts=TS[2], events=[kv.AllBlocksCleared()]),
    ]


def zmq_batches_sglang(kv) -> list:
    return [
        kv.KVEventBatch(ts=TS[0], events=[kv.BlockStored(
            block_hashes=[H_I64, -5], parent_block_hash=None, token_ids=TOKENS32,
            block_size=16, lora_id=None, medium=kv.StorageMedium.GPU)]),
        kv.KVEventBatch(ts=TS[1], events=[kv.BlockRemoved(
            block_hashes=[H_I64], medium=kv.StorageMedium.GPU)]),
        kv.KVEventBatch(ts=TS[2], events=[kv.AllBlocksCleared()]),
    ]


# ------------------------------------------------------- vLLM block hash ---

def vllm_block_hash_fixture(v: dict, version: str) -> list[dict]:
    ns, hash_ns = v["kvcu_ns"], v["hash_ns"]
    algos = ["sha256", "sha256_cbor"]
    if "xxhash" in hash_ns and getattr(hash_ns.get("_xxhash"), "xxh3_128_digest", None):
        algos += ["xxhash", "xxhash_cbor"]
    out = []
    tokens = list(range(100, 148))
    for algo in algos:
        fn = hash_ns[algo]
        seeds = ["0", "12345"]
        if "DEFAULT_NONE_HASH_SEED" in ns and algo.startswith("sha256"):
            seeds.append(None)  # unset: 0.34 uses the fixed default for sha256*
        for seed in seeds:
            old = os.environ.pop("PYTHONHASHSEED", None)
            if seed is not None:
                os.environ["PYTHONHASHSEED"] = seed
            try:
                ns["init_none_hash"](fn)
                none_hash = ns["NONE_HASH"]
                parent = None
                blocks = []
                for i in range(3):
                    blk = tokens[i * 16:(i + 1) * 16]
                    h = ns["hash_block_tokens"](fn, parent, blk, None)
                    blocks.append({"token_ids": blk, "hash_hex": h.hex(),
                                   "wire_int": ns["maybe_convert_block_hash"](h)})
                    parent = h
            finally:
                os.environ.pop("PYTHONHASHSEED", None)
                if old is not None:
                    os.environ["PYTHONHASHSEED"] = old
            out.append({"version": version, "algo": algo, "PYTHONHASHSEED": seed,
                        "none_hash_seed_string": seed if seed is not None
                        else ns.get("DEFAULT_NONE_HASH_SEED"),
                        "none_hash_hex": none_hash.hex(), "block_size": 16,
                        "extra_keys": None, "blocks": blocks})
    return out


# ------------------------------------------------------------------ main ---

def config_report(label: str, cls, parse_json) -> None:
    print(f"  KVEventsConfig ({label}) defaults:")
    d = cls()
    dd = d.model_dump() if hasattr(d, "model_dump") else dataclasses.asdict(d)
    print("   ", json.dumps(dd))
    for js in ('{"enable_kv_cache_events": true, "publisher": "zmq"}',
               '{"publisher": "zmq", "endpoint": "tcp://*:5557", "unknown_key": 1}',
               '{"enable_kv_cache_events": true}'):
        try:
            r = parse_json(js)
            r = r.model_dump() if hasattr(r, "model_dump") else dataclasses.asdict(r)
            print(f"    parse {js} -> {json.dumps(r)}")
        except Exception as e:  # noqa: BLE001
            print(f"    parse {js} -> ERROR {type(e).__name__}: "
                  f"{str(e).splitlines()[0]}")


def write(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1) + "\n")
    print(f"  wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-011", default=os.environ.get("KV_VLLM_011"))
    ap.add_argument("--vllm-034", default=os.environ.get("KV_VLLM_034"))
    ap.add_argument("--sglang", default=os.environ.get("KV_SGLANG"))
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--no-zmq", action="store_true", help="skip the live publisher runs")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.WARNING)

    print(f"python {sys.version.split()[0]}, msgspec {msgspec.__version__}, "
          f"pyzmq {zmq.__version__}, libzmq {zmq.zmq_version()}, "
          f"msgpack {'.'.join(map(str, msgpack.version))}")
    hash_rows = []
    for flag, root in (("vllm-0.11", args.vllm_011), ("vllm-0.34", args.vllm_034)):
        if not root:
            print(f"skip {flag}: no wheel dir")
            continue
        root = Path(root)
        dist = next(root.glob("vllm-*.dist-info")).name
        shape = "vllm-" + ".".join(dist.split("-")[1].split(".")[:2])
        print(f"\n== {shape} from {root} ({dist})")
        v = load_vllm(root)
        kv = v["kv"]
        for cls in (kv.EventBatch, kv.KVEventBatch, kv.KVCacheEvent, kv.BlockStored,
                    kv.BlockRemoved, kv.AllBlocksCleared):
            print("  " + json.dumps(describe_struct(cls)))
        print("  other Struct classes:", sorted(
            n for n, o in vars(kv).items()
            if isinstance(o, type) and issubclass(o, msgspec.Struct)
            and o.__module__ == kv.__name__
            and n not in ("EventBatch", "KVEventBatch", "KVCacheEvent", "BlockStored",
                          "BlockRemoved", "AllBlocksCleared")))
        from pydantic import TypeAdapter
        ta = TypeAdapter(v["cfg"].KVEventsConfig)
        config_report(shape, v["cfg"].KVEventsConfig, ta.validate_json)
        print("  ExternalBlockHash =", v["kvcu_ns"]["ExternalBlockHash"])
        cases = vllm_cases(kv, shape)
        for c in cases:
            print(f"  case {c['name']}: {len(c['payload_hex']) // 2} bytes, "
                  f"{c['payload_hex'][:48]}...")
        write(out / f"{shape}.json", cases)
        hash_rows += vllm_block_hash_fixture(v, shape)
        if not args.no_zmq:
            z = capture_zmq(shape, kv, "data_parallel_rank", zmq_batches_vllm(kv), True)
            print("  zmq live frames per message:", [len(m["frames_hex"]) for m in z["live"]],
                  "replay msgs per request:",
                  [len(r["reply_messages"]) for r in z["replay"]],
                  "end marker:", z["replay"][0]["reply_messages"][-1]["frames_hex"],
                  "invalid request replies:", len(z["invalid_request"]["reply_messages"]))
            write(out / f"{shape}-zmq.json", z)
    if hash_rows:
        write(out / "vllm-block-hash.json", hash_rows)

    if args.sglang:
        root = Path(args.sglang)
        dist = next(root.glob("sglang-*.dist-info")).name
        shape = "sglang-" + dist.removesuffix(".dist-info").split("-")[1]
        print(f"\n== {shape} from {root} ({dist})")
        sg = load_sglang(root)
        kv = sg["kv"]
        for cls in (kv.EventBatch, kv.KVEventBatch, kv.KVCacheEvent, kv.BlockStored,
                    kv.BlockRemoved, kv.AllBlocksCleared):
            print("  " + json.dumps(describe_struct(cls)))
        print("  StorageMedium:", {m.name: m.value for m in kv.StorageMedium})
        print("  other Struct classes:", sorted(
            n for n, o in vars(kv).items()
            if isinstance(o, type) and issubclass(o, msgspec.Struct)
            and o.__module__ == kv.__name__
            and n not in ("EventBatch", "KVEventBatch", "KVCacheEvent", "BlockStored",
                          "BlockRemoved", "AllBlocksCleared")))
        config_report(shape, kv.KVEventsConfig, kv.KVEventsConfig.from_cli)
        cases = sglang_cases(sg)
        for c in cases:
            print(f"  case {c['name']}: {len(c['payload_hex']) // 2} bytes, "
                  f"{c['payload_hex'][:48]}...")
        write(out / f"{shape}.json", cases)
        if not args.no_zmq:
            z = capture_zmq(shape, kv, "attn_dp_rank", zmq_batches_sglang(kv), False)
            print("  zmq live frames per message:", [len(m["frames_hex"]) for m in z["live"]],
                  "replay msgs per request:",
                  [len(r["reply_messages"]) for r in z["replay"]],
                  "end marker:", z["replay"][0]["reply_messages"][-1]["frames_hex"],
                  "invalid request replies:", len(z["invalid_request"]["reply_messages"]))
            write(out / f"{shape}-zmq.json", z)
    return 0


if __name__ == "__main__":
    sys.exit(main())
