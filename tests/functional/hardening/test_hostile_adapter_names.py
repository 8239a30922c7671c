"""A checkpoint's tensor names are someone's: recognising LoRA tensors among them (core/adapters/names.py) never
raises, does work linear in the names (counted through cProfile at n and 4n, not timed), lists a bounded
number of problems however many names are wrong, and never puts a name's escape sequences raw into a problem."""

from __future__ import annotations

import cProfile
import pstats

from ckpt_tui.core.adapters.names import MAX_NAME, MAX_PROBLEMS, lora_layout

ROOT = "base_model.model."
ESC = "\x1b]0;pwned\x07\x1b[2J\u202e"
RAW = ("\x1b", "\x07", "\u202e")


def _junk(n: int) -> dict[str, tuple[int, ...]]:
    """n names of every strange form: empty parts, LoRA parts out of place, other adapters, modules_to_save
    without a module, wrong shapes, prefixes that are not containers, repeated roots."""
    forms = [
        ROOT + "m{i}..lora_A.default.weight",
        ROOT + "m{i}.lora_A.adapter{i}.weight",
        ROOT + "m{i}.lora_B.default.weight",  # unpaired
        ROOT + "modules_to_save.default.weight",
        ROOT + "m{i}.modules_to_save.default",
        ROOT + "m{i}.lora_E.default",
        "junk{i}." + ROOT + "m{i}.lora_A.default.weight",
        ROOT * 3 + "m{i}.lora_A.weight",
        ROOT + "m{i}.token_adapter.trainable_tokens_delta.default",
        "lora_A.lora_B.lora_embedding_A.{i}",
        ".{i}.",
        ROOT + "m{i}.lora_A.default.bias",
        ROOT + "m{i}.lora_embedding_A.default.x",
    ]
    shapes = [(), (0,), (4,), (4, 0), (-1, 4), (4, 64), (64, 4)]
    return {
        f.format(i=i): shapes[i % len(shapes)] for i in range(n) for f in forms[i % len(forms) : i % len(forms) + 1]
    }


def _calls(fn) -> int:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    return sum(s[1] for s in pstats.Stats(prof).stats.values())  # type: ignore[attr-defined]


def test_100k_junk_names_never_raise_and_problems_stay_bounded():
    names = _junk(100_000)
    layout = lora_layout(names)
    assert layout is not None  # LoRA-looking names, all of them wrong
    assert layout.modules == [] and layout.saved == {}
    assert len(layout.problems) <= MAX_PROBLEMS + 1 and layout.problems[-1].startswith("… and ")
    assert len(layout.dropped) + layout.others + len(layout.saved) <= len(names)


def test_the_work_is_linear_in_the_names():
    small, big = _junk(3_000), _junk(12_000)
    n1 = _calls(lambda: lora_layout(small))
    n4 = _calls(lambda: lora_layout(big))
    assert n4 <= 4.5 * n1, (n1, n4)

    def valid(n):
        out = {}
        for i in range(n):
            out[f"{ROOT}model.layers.{i}.q_proj.lora_A.default.weight"] = (4, 64)
            out[f"{ROOT}model.layers.{i}.q_proj.lora_B.default.weight"] = (64, 4)
            out[f"{ROOT}model.layers.{i}.q_proj.base_layer.weight"] = (64, 64)
        return out

    small, big = valid(2_000), valid(8_000)
    n1 = _calls(lambda: lora_layout(small))
    n4 = _calls(lambda: lora_layout(big))
    assert n4 <= 4.5 * n1, (n1, n4)
    layout = lora_layout(big)
    assert layout is not None and len(layout.modules) == 8_000 and layout.others == 8_000


def test_many_other_adapters_make_a_bounded_list_of_problems():
    names = {f"{ROOT}m{i}.lora_A.a{i}.weight": (4, 8) for i in range(50_000)}
    layout = lora_layout(names)
    assert layout is not None and len(layout.dropped) == 50_000
    assert len(layout.problems) == MAX_PROBLEMS + 1


def test_escape_sequences_in_names_never_reach_a_problem_raw():
    names = {
        f"{ROOT}{ESC}.lora_A.default.weight": (4, 8),  # unpaired, module named with escapes
        f"{ROOT}m.lora_A.{ESC}.weight": (4, 8),  # another adapter, named with escapes
        f"{ROOT}k.lora_A.default.weight": (4, 8),
        f"{ROOT}k.lora_B.default.weight": (8, 2),  # ranks disagree
        f"x{ESC}." + ROOT + "q.lora_A.default.weight": (4, 8),  # not a container prefix
        f"{ROOT}q..{ESC}lora_A.default.weight": (4, 8),
        f"{ROOT}{ESC}.modules_to_save.default.weight": (4, 8),
        f"{ROOT}z.lora_A.default.weight": (4, 8),
        f"module.{ROOT}z.lora_A.default.weight": (4, 8),  # two names for one saved name
        f"{ROOT}z.lora_B.default.weight": (8, 4),
        f"{ESC}.lora_A.weight": (4, 8),  # not under base_model.model.
    }
    layout = lora_layout(names)
    assert layout is not None and len(layout.problems) >= 6
    for p in layout.problems:
        assert not any(c in p for c in RAW), repr(p)
    # the modules_to_save tensor keeps its name: a tensor name is data, escaped where shown, not here
    assert layout.modules_to_save == {f"{ESC}.weight": f"{ROOT}{ESC}.weight"}


def test_deeply_nested_and_overlong_names():
    deep = ROOT + "a." * 200_000 + "lora_A.default.weight"
    near = ROOT + "a." * ((MAX_NAME - 60) // 2) + "q"
    names = {
        deep: (4, 8),
        near + ".lora_A.default.weight": (4, 8),
        near + ".lora_B.default.weight": (8, 4),
        "x." * 300_000: (1,),
        ".": (1,),
        "": (1,),
    }
    layout = lora_layout(names)
    assert layout is not None
    assert [m.module for m in layout.modules] == [near.removeprefix(ROOT)]
    assert deep in layout.dropped and any("characters is not read" in p for p in layout.problems)
    assert layout.others == 3
    assert all(len(p) < 1000 for p in layout.problems)


def test_strange_shapes_and_keys_are_problems_not_errors():
    names = {
        f"{ROOT}a.lora_A.default.weight": (),
        f"{ROOT}a.lora_B.default.weight": (),
        f"{ROOT}b.lora_A.default.weight": (0, 8),
        f"{ROOT}b.lora_B.default.weight": (8, 0),
        f"{ROOT}c.lora_embedding_A.default": (4,),
        f"{ROOT}c.lora_embedding_B.default": (8, 4),
        f"{ROOT}d.lora_A.default.weight": (4, 8),
        f"{ROOT}d.lora_B.default.weight": (8, 4),
        f"{ROOT}d.lora_B.default.bias": (9,),
        f"{ROOT}e.lora_A.default.weight": (4, 8),
        f"{ROOT}e.lora_embedding_B.default": (8, 4),
        42: (1,),  # not a name at all
    }
    layout = lora_layout(names)  # type: ignore[arg-type]
    assert layout is not None and layout.modules == [] and layout.saved == {}
    assert len(layout.problems) == 5
    assert layout.others == 1
