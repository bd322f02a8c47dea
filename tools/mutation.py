"""The kept mutation score: run mutmut on the modules that decide, one module at a time, and write the
score of each to docs/mutation.md (section ``mutation``).

Usage (from the checkout, with the test extra installed):

    python tools/mutation.py [MODULE ...] [--max-children N] [--write] [--check] [--keep]
    python tools/mutation.py --report --write    # the modules measured since mutants/ was rebuilt

MODULE is a path listed in ``[tool.mutmut] only_mutate`` (default: all of them, in that order).
mutmut's own configuration (which modules, which unit tests) is in pyproject.toml. A module's
score is killed / mutants: a mutant no test reaches counts as surviving. The survivors that
are equivalent (no test can tell them from the original: the behaviour is the same) are listed
in ``EQUIVALENT`` with the reason; any other survivor is printed and listed as unexplained.
``--check`` exits 1 when a module is below ``THRESHOLD`` % (not in CI by default: the run takes
tens of minutes on two cores).

The mutants directory (``mutants/``) is rebuilt at the start of every run, so a result never
comes from an older version of a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import replace_section  # noqa: E402

THRESHOLD = 90.0
KILLED = {1, 3, 24, -24, 152, 255, 36}  # a failing test (or pytest error); SIGXCPU / timeout
SURVIVED = {0}
NO_TESTS = {5, 33}

# Survivors no test can kill: the mutated code behaves exactly as the original. Keyed by mutmut's
# mutant name; the reason says why the behaviour is the same.
_CG = "nriplugin.kernel.cgroup."
_ST = "nriplugin.kernel.stats."
_PERIOD = "the period only serves the exact-text shortcut; the quota is then compared decoded"
_SLOW = "takes the slow path (os.path.realpath of the whole path) more often: the same result"
_CACHE = "a cache of resolved directories (no effect on any result, only on how often paths are resolved)"
_REBASE = "re-bases the running sums at another time: a slope is the same about any origin (only rounding moves)"
_REBASED_EMPTY = "the origin when no point is kept: re-basing happens only as a point is added, so never"
_ORIGIN = "the sums' origin before any point: the first point sets it before it is read"
_NO_MODE = "no policy in force as '' rather than None: neither is cfsQuota or cpuset, so a round switches alike"
_CPUSET_LIFTED = (
    "lifts the cpuset limit on a switch to cpuset too: there is none then (it is lifted whenever cpuset stops)"
)
_QUOTA_LIFTED = (
    "lifts the quota on a switch to cfsQuota too: none is held then (lifted on every switch away and on off)"
)
_ENDING = "the default of bursting.get for a burst that ends: only a bursting container's burst ends, so it is there"
_DS = "nriplugin.node.desired.xǁDesiredStateǁ"
_BELOW_CEILING = "a quota of 0 or below is under any ceiling (at least 1000), so the next test leaves it too"
_OWN_CLASS = "_context decides the class from the pod itself rather than take the one handed: the same class"
_NO_NONE = "looks a class of None up where the original skips it: no class-wide table has a None key"
_NO_KEY = "the default key skipped, 'XXXX' for '': no container's key is either"
_QM = "nriplugin.qos.manager.xǁQoSManagerǁ"
_PG = "nriplugin.qos.manager.xǁPodGroupsǁ"
_LS_RSS = "_ls's RSS sum: its one caller, cpu_inputs, reads only usage and request"
_FALSE_NONE = "None for False: as false, and only ever tested for truth"
_FIRES = "the callback a trigger calls when it fires: a kernel that accepts PSI triggers (this one refuses them)"
_EV = "nriplugin.qos.eviction."
_CO = "nriplugin.qos.collect."
_CS = "nriplugin.qos.cpu_suppress.xǁCPUSuppressStrategyǁ"
_HELD_QUOTA = "a group's quota of 0 read as no limit: the kernel holds -1 or at least 1000 us, never 0"
_HELD_PERIOD = "a group's period of 0 or 1 us: the kernel's CFS period is at least 1000 us"
_XX_STRIP = (
    "strip('XX/XX') strips X and / from a group path's ends: kubelet's groups (kubepods, "
    "kubepods.slice, besteffort) neither start nor end with an X"
)
_NO_BUSY = "no busy ticks (an int) answered 0.0 early: 0 / total x ncpu is 0.0 all the same"
_ABSENT_REV = (
    "the absent entries' revision mark before any: the first filter runs on entries all added (and seen) "
    "that round, a no-op whether or not the mark makes it run"
)
_FACTS_REV = (
    "the facts' revision mark before the first round (the model's starts at 0): at the first round the "
    "facts are empty, so clearing them or not is the same, and the mark is the revision after it"
)
_PLAN_NAME = "the name of the plan made only to ask meaningful(): the plan handed on is made anew, named CPUEvict"
_GROUP_USAGE = "the BE groups read with their throttling too (or not): only their usage is used"
_LS_MAX = "max()'s default over the three LS classes: never empty, so never used"
_MEMINFO = "no /proc/meminfo: every Linux has one"
_FIRST_GAP = "the last check at +1 s or -2 s before any: the first event's delay is 0 on any clock past a few seconds"
_V2_PATH = "another controller for a cgroup v2 path (the only one asked): v2 has no controller in its paths"
_ANSWER_NONE = "an Answer whose result is None: outcome() reads anything unknown as an error, the same"
EQUIVALENT: dict[str, str] = {
    _CG + "x__read__mutmut_11": "reads 65537 bytes instead of 65536: every cgroup file is far smaller",
    _CG + "xǁCgroupsǁ_dir__mutmut_2": f"never reads the cache: {_CACHE}",
    _CG + "xǁCgroupsǁ_dir__mutmut_3": f"never finds the cached directory: {_CACHE}",
    _CG + "xǁCgroupsǁ_dir__mutmut_15": f"clears at 65536 entries instead of 65537: {_CACHE}",
    _CG + "xǁCgroupsǁ_dir__mutmut_16": f"clears at 65538 entries instead of 65537: {_CACHE}",
    _CG + "xǁCgroupsǁ_dir__mutmut_17": f"caches None, so always resolves again: {_CACHE}",
    _CG + "xǁCgroupsǁ_contained__mutmut_1": f"never reads the cached real base: {_CACHE}",
    _CG + "xǁCgroupsǁ_contained__mutmut_2": f"never finds the cached real base: {_CACHE}",
    _CG + "xǁCgroupsǁ_resolve__mutmut_3": _SLOW,
    _CG + "xǁCgroupsǁ_resolve__mutmut_4": _SLOW,
    _CG + "xǁCgroupsǁ_resolve__mutmut_6": _SLOW,
    _CG + "xǁCgroupsǁ_resolve__mutmut_8": "a '' component is resolved as is; it cannot move a path out of its parent",
    _CG + "xǁCgroupsǁ_resolve__mutmut_9": "a '.' component is resolved as is; it cannot move a path out of its parent",
    _CG + "xǁCgroupsǁ_resolve__mutmut_23": "`link = None` where False was: both false",
    _CG + "xǁCgroupsǁ_file__mutmut_13": "v2's controller None instead of '': both mean the unified root",
    _CG + "xǁCgroupsǁ_resolve__mutmut_12": f"never reads the cache: {_CACHE}",
    _CG + "xǁCgroupsǁ_resolve__mutmut_13": f"never finds the cached parent: {_CACHE}",
    _CG + "xǁCgroupsǁ_resolve__mutmut_17": f"clears at 65536 entries instead of 65537: {_CACHE}",
    _CG + "xǁCgroupsǁ_resolve__mutmut_18": f"clears at 65538 entries instead of 65537: {_CACHE}",
    _CG + "xǁCgroupsǁ_resolve__mutmut_19": f"caches None, so always resolves again: {_CACHE}",
    _CG + "xǁCgroupsǁ_resolve__mutmut_24": "realpath of a missing name under a resolved parent is that name",
    _CG + "xǁCgroupsǁ_resolve__mutmut_26": "realpath of a non-link under a resolved parent is that name",
    _CG + "xǁCgroupsǁdecode__mutmut_12": "rpartition of cpu.max's 'QUOTA PERIOD': the kernel writes exactly one space",
    _CG + "xǁCgroupsǁmatches__mutmut_11": _PERIOD,
    _CG + "xǁCgroupsǁmatches__mutmut_14": _PERIOD,
    _CG + "xǁCgroupsǁmatches__mutmut_29": "rpartition of an encoded device rule: it has exactly one space",
    _CG + "xǁCgroupsǁmatches__mutmut_33": "split() of an io.max line: the kernel separates its fields by single spaces",
    _CG + "xǁCgroupsǁmatches__mutmut_38": "split() of an io.max line: the kernel separates its fields by single spaces",
    _CG + "xǁCgroupsǁfit_descendants__mutmut_17": "os.walk(topdown=None): as false as False, the walk bottom-up",
    _CG + "xǁCgroupsǁfit_descendants__mutmut_58": (
        "a burst equal to the new quota written again: the same value, which the kernel accepts as it stands"
    ),
    _CG + "xǁCgroupsǁwrite__mutmut_94": "`errno or 1` where errno is one of EINVAL/EPERM/EACCES/EOPNOTSUPP, never 0",
    _ST + "x__psi_line__mutmut_4": "rpartition('=') of 'key=value': a field with a second '=' is refused either way",
    _ST + "x__psi_line__mutmut_35": "also checks total_us for finite and >= 0, which the next test does anyway",
    _CG + "x_shares_to_weight_log__mutmut_1": "2 shares through the formula: exponent 0, weight 1 all the same",
    _CG + "x_shares_to_weight_log__mutmut_2": "262144 shares through the formula: 10^4, weight 10000 all the same",
    _ST + "x_parse_limit__mutmut_3": "the 'max' shortcut skipped: parse_int('max') is None, so None all the same",
    _ST + "x_parse_limit__mutmut_4": "the 'max' shortcut skipped: parse_int('max') is None, so None all the same",
    _ST + "x_parse_limit__mutmut_13": "a 1-byte limit: the kernel keeps limits in pages (0 or multiples of 4096)",
    _ST + "x_field__mutmut_9": "rfind of a key: every key appears once in a kernel stat file",
    _ST + "x_field__mutmut_30": "`end <= 0`: a newline is searched after the key, so it is never at 0",
    _ST + "x_field__mutmut_31": "`end < 1`: a newline is searched after the key, so it is never at 0",
    _ST + "x_parse_loadavg__mutmut_5": "maxsplit=2 instead of 1: only the first field is read",
    _ST + "x_parse_meminfo__mutmut_2": "MemTotal starts at 1: the result exists only once MemTotal overwrote it",
    _ST + "x_parse_meminfo__mutmut_6": "`found = None`: `None or x` is x, as `False or x` is",
    _ST + "x_parse_pgscan__mutmut_5": "scans from the start, not the first pgscan_ line: other lines are skipped",
    _ST + "x_parse_pgscan__mutmut_25": "rpartition(' ') of 'key value': one space",
    _ST + "x_parse_psi_some_total__mutmut_10": "`total=` follows 'some ', so it is never at 0",
    _ST + "x_parse_psi_some_total__mutmut_11": "`total=` follows 'some ', so it is never at 0",
    _ST + "x_parse_psi_some_total__mutmut_14": "the first newline of a PSI file ends the some line, where total= is",
    _ST + "x_parse_psi_some_total__mutmut_16": "the first newline of a PSI file ends the some line, where total= is",
    _ST + "x_parse_psi_some_total__mutmut_24": "the newline is searched after total=, so it is never at 0",
    _ST + "x_parse_psi_some_total__mutmut_25": "the newline is searched after total=, so it is never at 0",
    "nriplugin.kernel.probe.x_core_sched_supported__mutmut_8": "the cookie's initial value: the kernel overwrites it",
    "nriplugin.features.cpuset.x_assign__mutmut_40": "`quota < 0` after `not quota`: 0 is already refused",
    "nriplugin.intent.cpus.xǁCPUAllocatorǁ__post_init____mutmut_5": "an insertion-ordered set's dummy value",
    "nriplugin.policy.model.x__seconds__mutmut_9": "one more pass at the end of the text: nothing matches there",
    "nriplugin.features.memory_qos.x__request__mutmut_30": "`limit >= 0` after `limit and`: 0 is already false",
    "nriplugin.features.memory_qos.x__request__mutmut_35": "the source text returned with no request is never shown",
    "nriplugin.features.memory_qos.x_desired__mutmut_75": "`v > 1`: memory.high is page-aligned, so 0 or >= 4096",
    # nri/ttrpc.py and nri/mux.py (sans-IO codecs)
    "nriplugin.nri.ttrpc.xǁMessageDecoderǁ__init____mutmut_3": (
        "the fill count starts at None: it is set with its buffer, before it is read"
    ),
    "nriplugin.nri.ttrpc.xǁMessageDecoderǁ__init____mutmut_4": (
        "the fill count starts at 1: it is set with its buffer, before it is read"
    ),
    "nriplugin.nri.ttrpc.xǁMessageDecoderǁ__init____mutmut_5": (
        "the filled message's header starts at None: set with its buffer, before it is read"
    ),
    "nriplugin.nri.ttrpc.xǁMessageDecoderǁ__init____mutmut_6": (
        "the filled message's header starts at (1, 0, 0): set with its buffer, before it is read"
    ),
    "nriplugin.nri.ttrpc.xǁMessageDecoderǁ__init____mutmut_7": (
        "the filled message's header starts at (0, 1, 0): set with its buffer, before it is read"
    ),
    "nriplugin.nri.ttrpc.xǁMessageDecoderǁ__init____mutmut_8": (
        "the filled message's header starts at (0, 0, 1): set with its buffer, before it is read"
    ),
    "nriplugin.nri.ttrpc.xǁMessageDecoderǁ__init____mutmut_11": (
        "the refused message starts at '': it is set with the skip count, before it is read"
    ),
    "nriplugin.nri.ttrpc.xǁMessageDecoderǁfeed__mutmut_21": (
        "a reported refused message is cleared to '': the next one is set before it is read"
    ),
    "nriplugin.nri.ttrpc.xǁMessageDecoderǁfeed__mutmut_36": (
        "`pos = n` filling a buffer: that runs at a feed's start (pos 0), or the chunk ends there"
    ),
    "nriplugin.nri.ttrpc.xǁMessageDecoderǁfeed__mutmut_48": (
        "exactly 10 bytes left go through the partial-header path: the same header is read"
    ),
    "nriplugin.nri.ttrpc.xǁMessageDecoderǁfeed__mutmut_55": (
        "a partial header takes the rest of the chunk either way; pos overshoots only as the loop stops"
    ),
    "nriplugin.nri.ttrpc.xǁMessageDecoderǁfeed__mutmut_59": (
        "`pos = take` for a partial header: that runs at a feed's start (pos 0), or the loop stops"
    ),
    "nriplugin.nri.ttrpc.xǁMessageDecoderǁfeed__mutmut_89": (
        "a message ending with the chunk is filled into a buffer, not sliced: same bytes, one copy"
    ),
    "nriplugin.nri.ttrpc.xǁConnectionǁ_too_large__mutmut_8": (
        "`sid >= last`: for sid == last it sets last to its own value"
    ),
    "nriplugin.nri.ttrpc.x_varint__mutmut_1": "0 through the loop rather than the table: b'\\x00' either way",
    "nriplugin.nri.ttrpc.x_varint__mutmut_2": "0 through the loop rather than the table: b'\\x00' either way",
    "nriplugin.nri.ttrpc.x__request_of__mutmut_13": (
        "the metadata listed even when there is none: an empty list either way"
    ),
    "nriplugin.nri.ttrpc.xǁConnectionǁsend_response__mutmut_17": (
        "payload None in the oversize answer: protobuf leaves the field unset, as it does for b''"
    ),
    "nriplugin.nri.ttrpc.xǁConnectionǁreceive_data__mutmut_1": (
        "a whole request the general way rather than in one step: the same event (whole_request's own tests "
        "hold that the step is taken)"
    ),
    "nriplugin.nri.mux.xǁDemultiplexerǁ__init____mutmut_2": (
        "no frame yet as None, not 0: both false, and set before read"
    ),
    "nriplugin.nri.mux.xǁDemultiplexerǁ_pieces__mutmut_52": "a dropped frame's conn None, not 0: both false",
    # features/net_qos.py, qos/net_suppress.py
    "nriplugin.netqos.desired.x_parse_total_bandwidth__mutmut_9": (
        "`MAX_RATE / 10**6` is 1000000.0: an int compares with it exactly as with 1000000"
    ),
    # qos/ (the QoS manager's decisions)
    "nriplugin.qos.scores.x__ls__mutmut_4": _LS_RSS,
    "nriplugin.qos.scores.x__ls__mutmut_11": _LS_RSS,
    "nriplugin.qos.scores.x__ls__mutmut_12": _LS_RSS,
    "nriplugin.qos.scores.x_cpu_pressure__mutmut_4": "`ncpu >= 0`: a count of 0 is taken as 0 either way",
    "nriplugin.qos.scores.x_memory_pressure__mutmut_104": (
        "the sum capped at 101: the four terms are capped at 35 + 25 + 20 + 20 = 100 already"
    ),
    "nriplugin.qos.trends.xǁWindowSlopeǁadd__mutmut_6": _REBASE,
    "nriplugin.qos.trends.xǁWindowSlopeǁadd__mutmut_7": _REBASE,
    "nriplugin.qos.trends.xǁWindowSlopeǁadd__mutmut_8": _REBASE,
    "nriplugin.qos.trends.xǁWindowSlopeǁadd__mutmut_9": _REBASE,
    "nriplugin.qos.trends.xǁWindowSlopeǁ__init____mutmut_3": _ORIGIN,
    "nriplugin.qos.trends.xǁWindowSlopeǁ__init____mutmut_4": _ORIGIN,
    "nriplugin.qos.trends.xǁWindowSlopeǁ_rebase__mutmut_3": _REBASED_EMPTY,
    "nriplugin.qos.trends.xǁWindowSlopeǁ_rebase__mutmut_6": _REBASED_EMPTY,
    "nriplugin.qos.cpu_burst.xǁBursterǁstep__mutmut_24": (
        "an ended burst's ratio 2.0, not 1.0: only bursting containers' ratios are read, and a new burst sets its own"
    ),
    "nriplugin.qos.cpu_suppress.xǁCPUSuppressStrategyǁoff__mutmut_21": (
        "no policy in force as '' rather than None: neither is cfsQuota or cpuset, so the next round switches alike"
    ),
    "nriplugin.qos.cpu_suppress.xǁCPUSuppressStrategyǁ_apply_quota__mutmut_13": (
        "`new <= before`: the limiter writes only a value beyond the deadband of the one before, never the same"
    ),
    "nriplugin.qos.cpu_suppress.xǁCPUSuppressStrategyǁ__init____mutmut_4": _NO_MODE,
    "nriplugin.qos.cpu_suppress.xǁCPUSuppressStrategyǁ_switch__mutmut_2": _CPUSET_LIFTED,
    "nriplugin.qos.cpu_suppress.xǁCPUSuppressStrategyǁ_switch__mutmut_3": _CPUSET_LIFTED,
    "nriplugin.qos.cpu_suppress.xǁCPUSuppressStrategyǁ_switch__mutmut_5": _QUOTA_LIFTED,
    "nriplugin.qos.cpu_suppress.xǁCPUSuppressStrategyǁ_switch__mutmut_7": _QUOTA_LIFTED,
    "nriplugin.qos.cpu_suppress.xǁCPUSuppressStrategyǁ_switch__mutmut_8": _QUOTA_LIFTED,
    "nriplugin.qos.cpu_suppress.xǁCPUSuppressStrategyǁ_switch__mutmut_9": _QUOTA_LIFTED,
    "nriplugin.qos.cpu_suppress.xǁLimiterǁreset__mutmut_2": (
        "a reset limiter's 'last was a cut' False: its next step writes a first limit, which sets it anyway"
    ),
    "nriplugin.qos.cpu_suppress.xǁLimiterǁstep__mutmut_43": "'last was a cut' None, not False: both false",
    "nriplugin.qos.cpu_burst.xǁCPUBurstStrategyǁburst__mutmut_93": _ENDING,
    "nriplugin.qos.cpu_burst.xǁCPUBurstStrategyǁburst__mutmut_95": _ENDING,
    "nriplugin.qos.cpu_burst.xǁCPUBurstStrategyǁburst__mutmut_96": _ENDING,
    _DS + "_ceiling__mutmut_6": _BELOW_CEILING,
    _DS + "_ceiling__mutmut_10": _BELOW_CEILING,
    _DS + "_ceiling__mutmut_11": _BELOW_CEILING,
    _DS + "_ceiling__mutmut_20": "`period >= 0`: a period in an intent is at least 1000 (the range table)",
    _DS + "_ceiling__mutmut_21": "`period > 1`: a period in an intent is at least 1000 (the range table)",
    _DS + "_cpuset_limit__mutmut_5": "`get('cpuset.cpus', None)`: None is as false as the False it replaces",
    _DS + "_cpuset_limit__mutmut_7": "`get('cpuset.cpus')`: its None is as false as the False it replaces",
    _DS
    + "removed__mutmut_8": "pop without a default from the class's members: a key with a class is always among them",
    _DS
    + "removed__mutmut_12": "pop without a default from the pods' classes: every pod the model adds is classified then",
    _DS + "sharers__mutmut_1": _NO_KEY,
    _DS + "_context__mutmut_3": _OWN_CLASS,
    _DS + "added__mutmut_7": "a class's members kept as keys of a dict: its values ('' for None) are never read",
    _DS + "added__mutmut_13": (
        "a pod, or a container that is no candidate, goes on to cpuset.assign, which pins neither (it returns at once)"
    ),
    _DS + "_compose__mutmut_62": _NO_NONE,
    _DS + "_compose__mutmut_74": _NO_NONE,
    _DS + "_class_stamp__mutmut_3": _NO_NONE,
    _DS + "_compose__mutmut_7": _OWN_CLASS,
    _DS + "_compose__mutmut_10": _OWN_CLASS,
    _DS + "invalidate__mutmut_7": "generations step by 2, not 1: they are only compared for a change",
    _DS + "__init____mutmut_19": "generations start from 1, not 0: they are only compared for a change",
    _DS + "invalidate__mutmut_10": (
        "an unknown key's generation is not dropped: a key leaves the model through removed(), which drops it"
    ),
    _DS + "_pool_moved__mutmut_1": _NO_KEY,
    _QM + "fast_round__mutmut_2": (
        "`not groups and last is None`: with no BE group the BE counter is None, so it returns all the same"
    ),
    _PG + "removed__mutmut_2": "a removed pod left among the news: the model no longer has it, so a refresh skips it",
    _QM + "__init____mutmut_36": (
        "None for the fast window's groups: unequal to any list as [] is to a non-empty one, and "
        "the fast path returns before the comparison while there is no BE group"
    ),
    _QM + "__init____mutmut_43": _FALSE_NONE,
    _QM + "__init____mutmut_45": _FALSE_NONE,
    _QM + "_seconds__mutmut_3": (
        "the groups' counters summed from 1 rather than 0: a constant offset, and only differences of the sum are used"
    ),
    _QM + "_why_not__mutmut_21": _FALSE_NONE,
    _QM + "start__mutmut_5": _FIRES,
    _QM + "start__mutmut_25": "the fast period said as 50.05 ms rather than 50: '%.0f' prints 50 all the same",
    _QM + "start__mutmut_28": _FIRES,
    _QM + "run__mutmut_2": (
        "the first round due at 1 s of monotonic time, not 0: the clock is past both once a loop runs"
    ),
    _QM + "run__mutmut_6": (
        "`now > next_round`: a later reading equal to the due time to the nanosecond takes the next loop turn"
    ),
    _QM + "run__mutmut_13": (
        "sleeps instead of waiting on the wake-up while a trigger is armed: the same rounds, a wake-up taken up "
        "to one fast period (50 ms) later; no unit test times that"
    ),
    # node/writer.py
    "nriplugin.node.writer.xǁWriterǁjoin__mutmut_12": "`processes=None`: as false as False (threads, not processes)",
    "nriplugin.node.writer.xǁWriterǁquota_rises__mutmut_34": (
        "an unreadable period as '' rather than None: neither is an int, so both take the default period"
    ),
    _EV + "loop.x_cpu_facts__mutmut_27": _LS_MAX,
    _EV + "loop.x_cpu_facts__mutmut_29": _LS_MAX,
    _EV + "loop.x_cpu_facts__mutmut_31": _LS_MAX,
    _EV + "loop.xǁEvictionǁ_meminfo_total__mutmut_3": _MEMINFO,
    _EV + "loop.xǁEvictionǁ_meminfo_total__mutmut_4": _MEMINFO,
    _EV + "loop.xǁEvictionǁ_settle__mutmut_14": "settle() without its unit: its default is bytes",
    _EV + "loop.xǁEvictionǁ__init____mutmut_23": _FALSE_NONE,
    _EV + "loop.xǁEvictionǁmemory_check__mutmut_52": _FALSE_NONE,
    _EV + "loop.xǁEvictionǁ_arm__mutmut_58": "v1_pressure without its mode: its default is hierarchy",
    _EV + "loop.xǁEvictionǁstart__mutmut_3": "the callback of the kernel's memory events: no unit test makes it notify",
    _EV + "loop.xǁEvictionǁ__init____mutmut_29": _FIRST_GAP,
    _EV + "loop.xǁEvictionǁ__init____mutmut_30": _FIRST_GAP,
    _EV + "loop.xǁEvictionǁ__init____mutmut_11": (
        "strip('XX/XX') strips the characters X and / from a pods root's ends: kubelet's roots "
        "(kubepods, kubepods.slice) neither start nor end with an X"
    ),
    _EV + "loop.xǁEvictionǁ_arm__mutmut_27": (
        "a capacity of exactly 1 byte not armed: MemTotal is counted in kB and limits in pages, so it is 0 or >= 1024"
    ),
    _EV + "loop.xǁEvictionǁ_pod_growth__mutmut_34": (
        "`t1 <= t2`: a pod's points are strictly increasing in time (observe_pods adds none at or before the last), "
        "so the point nearest the middle is never the last (the first wins a tie with it)"
    ),
    _EV + "loop.xǁEvictionǁcpu_round__mutmut_16": "candidates(memory=None): as false as False, so no memory is read",
    # node/desired.py: what BE's QoS-level group holds
    _DS + "_read_held__mutmut_12": _HELD_QUOTA,
    _DS + "_read_held__mutmut_13": _HELD_QUOTA,
    _DS + "_read_held__mutmut_25": _HELD_PERIOD,
    _DS + "_read_held__mutmut_26": _HELD_PERIOD,
    _DS + "_recap__mutmut_34": (
        "pop without a default: reached only when the ceiling in force moves to none, so it is there"
    ),
    _DS + "set_ceiling__mutmut_1": (
        "never takes the same ceiling as unchanged: _recap then finds the ceiling in force unmoved and returns"
    ),
    _DS + "bound__mutmut_3": _XX_STRIP,
    _DS + "group_written__mutmut_9": _XX_STRIP,
    _DS + "group_written__mutmut_14": _XX_STRIP,
    _DS + "group_written__mutmut_17": _XX_STRIP,
    _DS + "learn_held__mutmut_3": _XX_STRIP,
    # qos/cpu_suppress.py
    "nriplugin.qos.cpu_suppress.x_be_groups__mutmut_4": _XX_STRIP,
    _CS + "_group_idle__mutmut_5": "`get('cpu.idle', None)`: None is as false as the False it replaces",
    _CS + "_group_idle__mutmut_7": "`get('cpu.idle')`: its None is as false as the False it replaces",
    _CS + "off__mutmut_1": "_group_idle(None): as false as False, so the idle overlays are withdrawn alike",
    _CS + "off__mutmut_23": _NO_MODE,
    # qos/collect.py
    "nriplugin.qos.collect.xǁ_Accǁ__init____mutmut_5": _FALSE_NONE,
    "nriplugin.qos.collect.xǁCollectorǁpressure_path__mutmut_3": _V2_PATH,
    "nriplugin.qos.collect.xǁCollectorǁpressure_path__mutmut_5": _V2_PATH,
    "nriplugin.qos.collect.xǁCollectorǁpressure_path__mutmut_6": _V2_PATH,
    "nriplugin.qos.collect.xǁCollectorǁpressure_path__mutmut_7": _V2_PATH,
    "nriplugin.qos.collect.xǁCollectorǁ_group_cores__mutmut_2": _GROUP_USAGE,
    "nriplugin.qos.collect.xǁCollectorǁ_group_cores__mutmut_5": _GROUP_USAGE,
    "nriplugin.qos.collect.xǁCollectorǁ_group_cores__mutmut_7": _GROUP_USAGE,
    "nriplugin.qos.collect.xǁCollectorǁ_group_cores__mutmut_8": _GROUP_USAGE,
    _CO + "x__facts__mutmut_12": "`quota >= 0` after `quota and`: a quota of 0 is already false",
    _CO + "x_busy_cores__mutmut_12": _NO_BUSY,
    _CO + "x_busy_cores__mutmut_13": _NO_BUSY,
    _CO + "xǁCollectorǁ__init____mutmut_39": _ABSENT_REV,
    _CO + "xǁCollectorǁ__init____mutmut_40": _ABSENT_REV,
    _CO + "xǁCollectorǁ__init____mutmut_41": _ABSENT_REV,
    _CO + "xǁCollectorǁ__init____mutmut_42": _FACTS_REV,
    _CO + "xǁCollectorǁ__init____mutmut_43": _FACTS_REV,
    _CO + "xǁCollectorǁ__init____mutmut_44": _FACTS_REV,
    _CO + "xǁCollectorǁ__init____mutmut_46": (
        "the BE groups' counter key starts as 'XXXX', not '': no counter has that key, and the files kept "
        "for it are the same ('' after the prefix either way) until the first round with BE groups sets it"
    ),
    _CO + "xǁCollectorǁ_forget__mutmut_8": (
        "the absent entries filtered when there are none too (a no-op), which moves the revision mark: an "
        "entry is unseen only once its container left, which moves the revision past any mark"
    ),
    _CO + "xǁCollectorǁ_forget__mutmut_12": (
        "the absent entries filtered every round they exist, not once per revision: an entry is unseen only "
        "once its container left, a new revision that the original filters at too"
    ),
    # qos/eviction
    _EV + "victims.x_fewest__mutmut_18": (
        "`a < 0`: amounts are taken largest first, so after a 0 only 0s and less follow: no target above 0 is reached"
    ),
    _EV + "cpu.xǁCpuEvictDeciderǁ_plan__mutmut_2": _PLAN_NAME,
    _EV + "cpu.xǁCpuEvictDeciderǁ_plan__mutmut_10": _PLAN_NAME,
    _EV + "cpu.xǁCpuEvictDeciderǁ_plan__mutmut_11": _PLAN_NAME,
    _EV + "cpu.xǁCpuEvictDeciderǁ_plan__mutmut_12": _PLAN_NAME,
    _EV + "memory.x_release__mutmut_40": (
        "the growth's release reckoned without growth: at most use - capacity, below the level's 1.3 x (use - lower)"
    ),
    _EV + "memory.xǁMemoryEvictDeciderǁdecide__mutmut_19": (
        "the plan made only to ask meaningful() lists None victims: a plan in bytes never reads them"
    ),
    _EV + "memory.xǁMemoryEvictDeciderǁobserve__mutmut_10": (
        "drops the older of two readings when it left the window: the next reading drops it anyway, "
        "and growth needs three"
    ),
    _EV + "evictor.xǁEvictorǁ_evict__mutmut_65": _ANSWER_NONE,
    _EV + "evictor.xǁEvictorǁ_evict__mutmut_99": _ANSWER_NONE,
    _EV + "evictor.xǁEvictorǁ_failed__mutmut_20": (
        "a missing detail as None rather than '': both fall back to str(answer)"
    ),
    _EV + "evictor.xǁRuntimeBackendǁevict__mutmut_4": (
        "ListPodSandbox with None: gRPC sends no bytes, which is what an empty ListPodSandboxRequest is"
    ),
    _EV + "evictor.xǁRuntimeBackendǁevict__mutmut_70": (
        "the name of NoneType for an error without text: gRPC's errors always carry a status and details"
    ),
    _PG + "refresh_steps__mutmut_26": "a turn ends more often: the same pods taken in, in more turns",
    "nriplugin.qos.history.xǁCountersǁadvance__mutmut_22": (
        "min() of no deltas defaults to 1, not 0: neither is below 0"
    ),
    "nriplugin.qos.levels.xǁAssessorǁ_next_level__mutmut_4": (
        "`plain > level`: at plain == level the other branch gives max(level, min(level, >= level)): the same"
    ),
    "nriplugin.qos.levels.xǁAssessorǁupdate__mutmut_15": (
        "`raw > score`: at raw == score the fall gives raw + 0 x e^(-dt/fallTime), raw all the same"
    ),
}


# Functions that run only while their module is imported. mutmut imports the code once, before
# it forks a process per mutant, and switches a mutant on when the function is called: a
# function called only at import never runs mutated, so no test can kill its mutants. They are
# listed, not counted; what such a function builds is pinned by the tests named here.
IMPORT_TIME: dict[str, str] = {
    "nriplugin.nri.ttrpc.x__envelope_classes": (
        "builds the envelope message classes at import; their wire layout is pinned byte for byte "
        "by tests/test_ttrpc_reference.py and against the vendored request.proto by tests/test_ttrpc.py"
    ),
}


def import_time(name: str) -> str | None:
    return IMPORT_TIME.get(name.rpartition("__mutmut_")[0])


@dataclass
class Score:
    module: str
    total: int = 0
    killed: int = 0
    survivors: list[str] = field(default_factory=list)
    no_tests: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)  # skipped, suspicious, not checked
    at_import: list[str] = field(default_factory=list)  # in IMPORT_TIME functions: never run
    seconds: float = 0.0

    @property
    def counted(self) -> int:
        return self.total - len(self.at_import)

    @property
    def score(self) -> float:
        return 100.0 * self.killed / self.counted if self.counted else 0.0

    @property
    def unexplained(self) -> list[str]:
        return [m for m in self.survivors + self.no_tests + self.other if m not in EQUIVALENT]


def configured_modules() -> list[str]:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    return list(conf["only_mutate"])


def dotted(module: str) -> str:
    return module.removesuffix(".py").replace("/", ".")


def mutmut() -> list[str]:
    exe = Path(sys.executable).with_name("mutmut")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "mutmut"]


def not_killed(module: str) -> list[str]:
    """A module's mutants that the last run did not kill (survived, no test, not checked)."""
    s = read_score(module)
    return s.survivors + s.no_tests + s.other


def run_batch(modules: list[str], max_children: int, survivors: bool = False) -> list[Score]:
    """mutmut on modules' mutants (every one re-tested), then their results from the meta files.
    One run over several modules pays its start (listing and running the tests once) once, not
    per module; each module is given the run's time in proportion to its mutants."""
    t0 = time.monotonic()
    env = dict(os.environ, NRIPLUGIN_HYPOTHESIS_PROFILE="mutation")  # tests/conftest.py: fixed examples
    # --survivors: only the mutants the last run left alive (tests were added; a killed mutant
    # stays killed by the tests that killed it, so the score is the same as a full re-run's)
    names = [n for m in modules for n in not_killed(m)] if survivors else [f"{dotted(m)}.*" for m in modules]
    if not names:
        return [read_score(m, measured().get(m, 0.0)) for m in modules]
    cmd = [*mutmut(), "run", "--max-children", str(max_children), *names]
    with open(ROOT / "mutants" / "run.log", "a") as log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        raise SystemExit(f"mutmut failed on {', '.join(modules)} (exit {rc}); see mutants/run.log")
    seconds = time.monotonic() - t0
    scores = [read_score(m) for m in modules]
    total = sum(s.total for s in scores) or 1
    for s in scores:
        s.seconds = seconds * s.total / total + (measured().get(s.module, 0.0) if survivors else 0.0)
        record_time(s.module, s.seconds)
    return scores


DOC = ROOT / "docs" / "mutation.md"
TIMES = ROOT / "mutants" / "mutation-times.json"  # seconds per module, for --report


def record_time(module: str, seconds: float) -> None:
    times = json.loads(TIMES.read_text()) if TIMES.exists() else {}
    times[module] = round(seconds, 1)
    TIMES.write_text(json.dumps(times, indent=1))


def measured() -> dict[str, float]:
    """Modules run (to the end) since mutants/ was last rebuilt, with their run time."""
    return json.loads(TIMES.read_text()) if TIMES.exists() else {}


def read_score(module: str, seconds: float = 0.0) -> Score:
    meta = json.loads((ROOT / "mutants" / f"{module}.meta").read_text())
    s = Score(module, seconds=seconds)
    for name, code in sorted(meta["exit_code_by_key"].items(), key=lambda kv: _order(kv[0])):
        s.total += 1
        if import_time(name) and code not in KILLED:
            s.at_import.append(name)
        elif code in KILLED:
            s.killed += 1
        elif code in SURVIVED:
            s.survivors.append(name)
        elif code in NO_TESTS:
            s.no_tests.append(name)
        else:
            s.other.append(name)
    return s


def _order(name: str) -> tuple[str, int]:
    head, _, n = name.rpartition("__mutmut_")
    return head, int(n) if n.isdigit() else 0


def short(name: str) -> str:
    """``nriplugin.kernel.cgroup.xǁCgroupsǁmatches__mutmut_7`` -> ``Cgroups.matches #7``."""
    head, _, n = name.rpartition("__mutmut_")
    func = head.rsplit(".", 1)[-1].removeprefix("x_").replace("xǁ", "").replace("ǁ", ".")
    return f"{func} #{n}" if n else func


def earlier_lines(text: str, modules: list[str]) -> dict[str, list[str]]:
    """Per module of ``modules``, its table row and survivor lines in an earlier section
    (``text``): a batch that re-measures some modules keeps what was measured of the others."""
    out: dict[str, list[str]] = {m: [] for m in modules}
    for ln in text.splitlines():
        for m in modules:
            if ln.startswith((f"| `{m}` |", f"- `{m}` `")):
                out[m].append(ln)
    for fn in IMPORT_TIME:  # an uncounted function's line goes with its module
        owner = next((m for m in modules if fn.startswith(dotted(m) + ".")), None)
        if owner is not None:
            out[owner] += [
                ln
                for ln in text.splitlines()
                if ln.startswith("- not counted: ") and f"`{short(fn + '__mutmut_')}`" in ln
            ]
    return out


def _survivor_lines(s: Score) -> list[str]:
    lines = []
    for m in s.survivors + s.no_tests:
        why = EQUIVALENT.get(m, "**not explained**: a test is missing")
        lines.append(f"- `{s.module}` `{short(m)}`: {why}")
    if s.other:  # a run stopped before it got to them (or mutmut could not tell)
        lines.append(f"- `{s.module}`: {len(s.other)} mutants **not checked** (the run was stopped before them)")
    for fn, why in IMPORT_TIME.items():
        n = sum(1 for m in s.at_import if m.startswith(fn + "__mutmut_"))
        if n:
            lines.append(f"- not counted: {n} mutants of `{short(fn + '__mutmut_')}`, which {why}")
    return lines


def section(scores: list[Score], command: str, earlier: str = "") -> str:
    try:
        version = metadata.version("mutmut")
    except metadata.PackageNotFoundError:  # reporting only (tests): mutmut runs need it installed
        version = "(not installed)"
    lines = [
        "<!-- mutation:begin -->",
        "## Mutation score of the modules that decide (`tools/mutation.py`)",
        "",
        f"{command} — mutmut {version}, unit tests only (`[tool.mutmut]` in pyproject.toml: no",
        "containerd, no Go peers, no test that runs a real process), one child process, on this",
        "2-core machine shared with other work. Score = killed / mutants: a survivor counts against",
        "it even where it is explained as equivalent below, and so does a mutant no test reaches.",
        "mutmut 3 mutates function bodies, not module-level tables: the `RESOURCES` range table and",
        "the protocol constants are pinned by reference tables instead (`tests/*_reference.py`).",
        "Mutants of a function that runs only at import cannot be switched on by mutmut: they are",
        "listed apart and not counted.",
        f"Run as {'root: the tests on the real cgroup tree ran too' if os.geteuid() == 0 else 'an unprivileged user'}.",
        "",
        "| module | mutants | killed | survived (equivalent) | no test | at import | score | time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    measured = {s.module: s for s in scores}
    order = [*configured_modules(), *(m for m in measured if m not in configured_modules())]
    kept = earlier_lines(earlier, [m for m in order if m not in measured])
    listed: list[str] = []
    for module in order:
        s = measured.get(module)
        if s is None:
            lines += [ln for ln in kept[module] if ln.startswith("|")]
            listed += [ln for ln in kept[module] if not ln.startswith("|")]
            continue
        eq = sum(1 for m in s.survivors if m in EQUIVALENT)
        lines.append(
            f"| `{s.module}` | {s.total} | {s.killed} | {len(s.survivors)} ({eq}) | {len(s.no_tests)} | "
            f"{len(s.at_import)} | {s.score:.1f} % | {s.seconds:.0f} s |"
        )
        listed += _survivor_lines(s)
    if any(kept.values()):
        lines += ["", "Rows of modules this batch did not re-run are kept from the run before."]
    lines += ["", "Surviving mutants (`mutmut show NAME` prints the diff):", ""]
    lines += listed or ["- none"]
    lines += ["<!-- mutation:end -->", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help="paths from [tool.mutmut] only_mutate (default: all)")
    ap.add_argument("--max-children", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--write", action="store_true", help="write the section into docs/mutation.md")
    ap.add_argument("--check", action="store_true", help=f"exit 1 when a module is below {THRESHOLD:g} %%")
    ap.add_argument("--keep", action="store_true", help="reuse mutants/ from an earlier run")
    ap.add_argument("--batch", action="store_true", help="the modules in one mutmut run (its start paid once)")
    ap.add_argument("--survivors", action="store_true", help="re-test only what the last run left alive (with --keep)")
    ap.add_argument("--report", action="store_true", help="run nothing: report every module run since the rebuild")
    ns = ap.parse_args(argv)
    known = configured_modules()
    modules = ns.modules or known
    unknown = [m for m in modules if m not in known]
    if unknown:
        ap.error(f"not in [tool.mutmut] only_mutate: {', '.join(unknown)}")
    if ns.report:
        done = measured()
        scores = [read_score(m, done[m]) for m in known if m in done]
        for s in scores:
            print(f"{s.module}: {s.killed}/{s.counted} killed ({s.score:.1f} %)")
        if ns.write:
            how = (
                "`python tools/mutation.py --write` (run here as `--keep [--batch] MODULE...` batches, "
                "`--survivors` re-tests once tests were added, then `--report --write`)"
            )
            replace_section(ROOT / "docs" / "mutation.md", "mutation", section(scores, how, DOC.read_text()))
        return 1 if ns.check and any(s.score < THRESHOLD for s in scores) else 0
    if not ns.keep:
        shutil.rmtree(ROOT / "mutants", ignore_errors=True)
    (ROOT / "mutants").mkdir(exist_ok=True)
    command = "`python tools/mutation.py --write" + (" " + " ".join(ns.modules) if ns.modules else "") + "`"
    scores = []
    batches = [modules] if ns.batch else [[m] for m in modules]
    for batch in batches:
        for s in run_batch(batch, ns.max_children, ns.survivors):
            scores.append(s)
            print(f"{s.module}: {s.killed}/{s.counted} killed ({s.score:.1f} %) in {s.seconds:.0f} s", flush=True)
            for m in s.unexplained:
                print(f"  unexplained survivor: {m}", flush=True)
        if ns.write:  # after every module: a long run that is stopped keeps what it measured
            replace_section(ROOT / "docs" / "mutation.md", "mutation", section(scores, command, DOC.read_text()))
    low = [s.module for s in scores if s.score < THRESHOLD]
    if low:
        print(f"below {THRESHOLD:g} %: {', '.join(low)}", file=sys.stderr)
    return 1 if ns.check and low else 0


if __name__ == "__main__":
    raise SystemExit(main())
