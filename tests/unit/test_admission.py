"""Admission: per-tenant ITPM/OTPM token buckets, concurrency and queued-token caps."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from switchyard.errors import SwitchyardError
from switchyard.scheduling.admission import CAP_RETRY_AFTER, Admission
from switchyard.scheduling.policy import Policies, TenantPolicy

# Plenty, so a test only meets the limit it is about.
BIG = 10**9


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def policy(**overrides: object) -> TenantPolicy:
    fields: dict[str, object] = {
        "itpm": BIG,
        "otpm": BIG,
        "max_concurrency": 10**6,
        "max_queued_tokens": BIG,
    }
    fields.update(overrides)
    return TenantPolicy.model_validate(fields)


def admission(clock: Clock, **overrides: object) -> Admission:
    return Admission(Policies(tenants={"acme": policy(**overrides)}), clock)


# --- token buckets -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("itpm", "first", "second"),
    [
        (6_000, 5_000, 2_000),  # 100 tokens/s: wait exactly 10 s
        (7_000, 6_999, 3_001),  # 116.67 tokens/s: wait not a round number
        (1_000_003, 1_000_000, 777_777),
        (60, 60, 1),  # one token a second, empty bucket
    ],
)
def test_itpm_refusal_retry_after_is_when_the_same_request_fits(
    itpm: int, first: int, second: int
) -> None:
    clock = Clock(12_345.678)
    adm = admission(clock, itpm=itpm)
    assert adm.admit("acme", "r1", first, 0, 0).ok

    refused = adm.admit("acme", "r2", second, 0, 0)
    assert not refused.ok
    assert refused.code == "over_quota"
    assert "input" in refused.reason
    assert refused.retry_after is not None
    exact = (second - (itpm - first)) / (itpm / 60.0)
    # Rounded up to the next 10 ms, never down: retrying at retry_after must work.
    assert exact <= refused.retry_after <= exact + 0.01 + 1e-9

    retry_at = clock.now + refused.retry_after
    clock.now = retry_at - 0.05  # not noticeably before
    early = adm.admit("acme", "r2", second, 0, 0)
    assert not early.ok
    assert early.retry_after is not None
    assert 0 < early.retry_after <= 0.06 + 1e-9

    clock.now = retry_at
    assert adm.admit("acme", "r2", second, 0, 0).ok


def test_retry_after_holds_for_many_bucket_states() -> None:
    """Fill the bucket with a mix of requests at odd times; each refusal's retry_after works."""
    clock = Clock(1_700_000_000.123)
    itpm = 9_973
    adm = admission(clock, itpm=itpm)
    sizes = [1_234, 4_321, 977, 9_973, 1, 5_000, 2_718, 3_141]
    refusals = 0
    for n in range(400):
        size = sizes[n % len(sizes)]
        verdict = adm.admit("acme", f"r{n}", size, 0, 0)
        if not verdict.ok:
            refusals += 1
            assert verdict.retry_after is not None
            clock.advance(verdict.retry_after)
            assert adm.admit("acme", f"r{n}", size, 0, 0).ok, (n, verdict)
        clock.advance(0.37 * (n % 3))
    assert refusals > 100  # the loop did exercise the refusal path


def test_otpm_is_enforced_separately_from_itpm() -> None:
    clock = Clock()
    adm = admission(clock, itpm=BIG, otpm=1_200)  # 20 output tokens/s
    assert adm.admit("acme", "r1", 100_000, 1_000, 0).ok
    refused = adm.admit("acme", "r2", 10, 600, 0)
    assert not refused.ok
    assert refused.code == "over_quota"
    assert "output" in refused.reason
    assert refused.retry_after == pytest.approx((600 - 200) / 20.0, abs=0.011)
    # Input-only requests still pass: the input bucket is not the one that is short.
    assert adm.admit("acme", "r3", 500_000, 0, 0).ok
    assert refused.retry_after is not None
    clock.advance(refused.retry_after)
    assert adm.admit("acme", "r2", 10, 600, 0).ok


def test_itpm_is_enforced_separately_from_otpm() -> None:
    clock = Clock()
    adm = admission(clock, itpm=1_200, otpm=BIG)
    assert adm.admit("acme", "r1", 1_000, 100_000, 0).ok
    refused = adm.admit("acme", "r2", 600, 10, 0)
    assert not refused.ok
    assert "input" in refused.reason
    assert refused.retry_after == pytest.approx(20.0, abs=0.011)
    assert adm.admit("acme", "r3", 0, 500_000, 0).ok


def test_refusal_reports_the_longer_of_the_two_waits() -> None:
    clock = Clock()
    adm = admission(clock, itpm=600, otpm=60)  # 10 input/s, 1 output/s
    assert adm.admit("acme", "r1", 600, 60, 0).ok
    refused = adm.admit("acme", "r2", 100, 30, 0)  # input: 10 s, output: 30 s
    assert "output" in refused.reason
    assert refused.retry_after == pytest.approx(30.0, abs=0.011)
    clock.advance(10.0)
    assert not adm.admit("acme", "r2", 100, 30, 0).ok
    clock.advance(20.0)
    assert adm.admit("acme", "r2", 100, 30, 0).ok


def test_a_refused_request_charges_nothing() -> None:
    clock = Clock()
    adm = admission(clock, itpm=1_000, otpm=1_000)
    assert adm.admit("acme", "r1", 900, 900, 0).ok
    for _ in range(5):
        assert not adm.admit("acme", "big", 500, 500, 0).ok
    assert adm.inflight("acme") == 1
    assert adm.admit("acme", "r2", 100, 100, 0).ok  # exactly what is left


def test_unused_output_is_refunded_on_finished() -> None:
    clock = Clock()
    adm = admission(clock, itpm=1_000, otpm=1_000)
    assert adm.admit("acme", "r1", 400, 1_000, 0).ok
    assert not adm.admit("acme", "r2", 0, 1, 0).ok
    adm.finished("r1", completion_tokens=100)
    assert adm.inflight("acme") == 0
    assert not adm.admit("acme", "r2", 0, 901, 0).ok  # only 900 came back
    assert adm.admit("acme", "r2", 0, 900, 0).ok
    # Input was used, so it is not refunded.
    assert not adm.admit("acme", "r3", 601, 0, 0).ok
    assert adm.admit("acme", "r3", 600, 0, 0).ok


def test_output_over_max_tokens_refunds_nothing_and_charges_nothing_extra() -> None:
    clock = Clock()
    adm = admission(clock, otpm=1_000)
    assert adm.admit("acme", "r1", 0, 500, 0).ok
    adm.finished("r1", completion_tokens=800)
    assert adm.admit("acme", "r2", 0, 500, 0).ok
    assert not adm.admit("acme", "r3", 0, 1, 0).ok


def test_finished_none_refunds_everything() -> None:
    clock = Clock()
    adm = admission(clock, itpm=1_000, otpm=1_000)
    assert adm.admit("acme", "r1", 1_000, 1_000, 0).ok
    assert not adm.admit("acme", "r2", 1, 0, 0).ok
    assert not adm.admit("acme", "r2", 0, 1, 0).ok
    adm.finished("r1", completion_tokens=None)
    assert not adm.holds("r1")
    assert adm.inflight("acme") == 0
    assert adm.admit("acme", "r2", 1_000, 1_000, 0).ok


def test_finished_twice_or_unknown_is_a_no_op() -> None:
    clock = Clock()
    adm = admission(clock, max_concurrency=1, itpm=1_000)
    assert adm.admit("acme", "r1", 1_000, 0, 0).ok
    adm.finished("r1", None)
    adm.finished("r1", None)  # must not refund again nor free a second slot
    adm.finished("never-admitted", 5)
    assert adm.admit("acme", "r2", 1_000, 0, 0).ok
    assert not adm.admit("acme", "r3", 0, 0, 0).ok  # concurrency 1 is still enforced
    assert not adm.admit("acme", "r3", 1, 0, 0).ok


def test_refund_never_overfills_the_bucket() -> None:
    clock = Clock()
    adm = admission(clock, otpm=1_000)
    assert adm.admit("acme", "r1", 0, 1_000, 0).ok
    clock.advance(120.0)  # fully refilled meanwhile
    adm.finished("r1", 0)  # refund 1,000 into a full bucket
    assert adm.admit("acme", "r2", 0, 1_000, 0).ok
    assert not adm.admit("acme", "r3", 0, 1, 0).ok


# --- caps ----------------------------------------------------------------------------


def test_concurrency_cap_counts_queued_and_running() -> None:
    clock = Clock()
    adm = admission(clock, max_concurrency=2)
    assert adm.admit("acme", "r1", 10, 10, 0).ok
    assert adm.admit("acme", "r2", 10, 10, 0).ok
    refused = adm.admit("acme", "r3", 10, 10, 0)
    assert not refused.ok
    assert refused.code == "over_quota"
    assert refused.retry_after == CAP_RETRY_AFTER
    assert adm.inflight("acme") == 2
    adm.dispatched("r1")  # running still counts
    assert not adm.admit("acme", "r3", 10, 10, 0).ok
    adm.finished("r1", 10)
    assert adm.admit("acme", "r3", 10, 10, 0).ok
    assert adm.inflight("acme") == 2


def test_queued_token_cap_frees_on_dispatch() -> None:
    clock = Clock()
    adm = admission(clock, max_queued_tokens=1_000)
    assert adm.admit("acme", "r1", 400, 200, 0).ok  # 600 queued
    assert adm.admit("acme", "r2", 200, 100, 0).ok  # 900 queued
    refused = adm.admit("acme", "r3", 100, 101, 0)
    assert not refused.ok
    assert refused.code == "over_quota"
    assert refused.retry_after == CAP_RETRY_AFTER
    assert adm.admit("acme", "r3", 50, 50, 0).ok  # exactly 1,000
    adm.dispatched("r1")
    adm.dispatched("r1")  # a second dispatch must not subtract again
    # 400 queued now (r2 + r3): 601 more would exceed the cap, 600 fits.
    assert not adm.admit("acme", "r4", 601, 0, 0).ok
    assert adm.admit("acme", "r4", 600, 0, 0).ok


def test_queued_token_cap_frees_when_a_queued_request_finishes() -> None:
    clock = Clock()
    adm = admission(clock, max_queued_tokens=1_000)
    assert adm.admit("acme", "r1", 500, 500, 0).ok
    assert not adm.admit("acme", "r2", 1, 0, 0).ok
    adm.finished("r1", None)  # cancelled while queued
    assert adm.admit("acme", "r2", 500, 500, 0).ok
    adm.dispatched("r2")
    adm.finished("r2", 500)  # was running: must not subtract the queued tokens again
    assert adm.admit("acme", "r3", 500, 500, 0).ok
    assert not adm.admit("acme", "r4", 1, 0, 0).ok


# --- usage ---------------------------------------------------------------------------


def test_usage_reports_each_tenant_seen_with_its_buckets_refilled_to_now() -> None:
    clock = Clock()
    adm = Admission(
        Policies(tenants={"acme": policy(itpm=6_000, otpm=600), "nova": policy(itpm=60, otpm=60)}),
        clock,
    )
    assert adm.usage(clock.now) == []
    assert adm.admit("acme", "r1", 1_200, 300, 0).ok
    assert adm.admit("acme", "r2", 300, 100, 0).ok
    adm.dispatched("r2")
    assert not adm.admit("nova", "r3", 61, 0, 0).ok  # refused, but the tenant was seen
    clock.advance(3.0)  # acme's input refills 100/s: 300 of the 1,500 taken come back
    usage = {u.tenant: u for u in adm.usage(clock.now)}
    assert set(usage) == {"acme", "nova"}
    acme = usage["acme"]
    assert acme.policy.itpm == 6_000 and acme.policy.otpm == 600
    assert acme.input_used == pytest.approx(1_200)
    assert acme.output_used == pytest.approx(400 - 3 * 10)  # otpm 600: 10/s
    assert acme.inflight == 2
    assert acme.queued_tokens == 1_500  # r1 still queued; r2 was dispatched
    nova = usage["nova"]
    assert (nova.input_used, nova.output_used, nova.inflight, nova.queued_tokens) == (0, 0, 0, 0)
    adm.finished("r1", None)
    adm.finished("r2", 100)
    acme = {u.tenant: u for u in adm.usage(clock.now)}["acme"]
    assert (acme.inflight, acme.queued_tokens) == (0, 0)


# --- never satisfiable ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "max_tokens"),
    [
        pytest.param(1_001, 0, id="itpm"),
        pytest.param(0, 501, id="otpm"),
        # Each fits its bucket, together they exceed the queued-token cap.
        pytest.param(700, 400, id="queued"),
    ],
)
def test_request_larger_than_a_capacity_is_invalid_not_retryable(
    prompt: int, max_tokens: int
) -> None:
    clock = Clock()
    adm = admission(clock, itpm=1_000, otpm=500, max_queued_tokens=1_000)
    verdict = adm.admit("acme", "r1", prompt, max_tokens, 0)
    assert not verdict.ok
    assert verdict.code == "invalid_request"
    assert verdict.retry_after is None
    assert not adm.holds("r1")
    assert adm.inflight("acme") == 0
    # It stays invalid however long one waits.
    clock.advance(3_600.0)
    assert adm.admit("acme", "r1", prompt, max_tokens, 0).code == "invalid_request"


def test_request_exactly_at_capacity_is_admitted() -> None:
    clock = Clock()
    adm = admission(clock, itpm=1_000, otpm=500, max_queued_tokens=1_500)
    assert adm.admit("acme", "r1", 1_000, 500, 0).ok
    adm.dispatched("r1")
    refused = adm.admit("acme", "r2", 1_000, 500, 0)
    assert refused.code == "over_quota"  # not satisfiable now, but later: retryable
    assert refused.retry_after is not None
    assert refused.retry_after == pytest.approx(60.0, abs=0.011)
    assert not math.isinf(refused.retry_after)
    clock.advance(refused.retry_after)
    assert adm.admit("acme", "r2", 1_000, 500, 0).ok


# --- tenants and priorities ----------------------------------------------------------


def test_unknown_tenant_is_refused_without_a_default() -> None:
    adm = Admission(Policies(tenants={"acme": policy()}), Clock())
    verdict = adm.admit("stranger", "r1", 1, 1, 0)
    assert not verdict.ok
    assert verdict.code == "unknown_tenant"
    assert verdict.retry_after is None
    assert adm.policy("stranger") is None
    assert not adm.holds("r1")
    assert adm.admit("acme", "r2", 1, 1, 0).ok


def test_default_policy_applies_to_unlisted_tenants() -> None:
    clock = Clock()
    default = policy(itpm=1_000)
    listed = policy(itpm=5_000)
    adm = Admission(Policies(default=default, tenants={"acme": listed}), clock)
    assert adm.policy("stranger") == default
    assert adm.policy("acme") == listed
    assert adm.admit("stranger", "s1", 1_000, 0, 0).ok
    assert adm.admit("stranger", "s2", 1, 0, 0).code == "over_quota"
    assert adm.admit("stranger", "s3", 1_001, 0, 0).code == "invalid_request"
    # Each unlisted tenant gets its own buckets, not one shared default bucket.
    assert adm.admit("other", "o1", 1_000, 0, 0).ok
    # A listed tenant keeps its own (larger) limits.
    assert adm.admit("acme", "a1", 5_000, 0, 0).ok


@pytest.mark.parametrize(("asked", "given"), [(0, 2), (1, 2), (2, 2), (4, 4), (5, 5), (9, 5)])
def test_priority_is_clamped_into_the_tenants_range(asked: int, given: int) -> None:
    adm = admission(Clock(), priority=(2, 5))
    verdict = adm.admit("acme", "r1", 1, 1, asked)
    assert verdict.ok
    assert verdict.priority == given
    # A redelivery keeps the clamp.
    assert adm.admit("acme", "r1", 1, 1, asked).priority == given


def test_redelivered_request_is_not_charged_twice() -> None:
    clock = Clock()
    adm = admission(clock, itpm=1_000, otpm=1_000, max_concurrency=2)
    assert adm.admit("acme", "r1", 600, 600, 0).ok
    again = adm.admit("acme", "r1", 600, 600, 0)
    assert again.ok
    assert adm.inflight("acme") == 1
    assert adm.admit("acme", "r2", 400, 400, 0).ok  # the rest of both buckets
    assert adm.inflight("acme") == 2
    adm.dispatched("r1")
    assert adm.admit("acme", "r1", 600, 600, 0).ok  # redelivered after dispatch
    assert adm.inflight("acme") == 2
    adm.finished("r1", 600)
    adm.finished("r2", 400)
    assert adm.inflight("acme") == 0


# --- policy file ---------------------------------------------------------------------


def test_policies_load_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(
        "default:\n"
        "  itpm: 200000\n"
        "  otpm: 20000\n"
        "tenants:\n"
        "  acme: {itpm: 1000000, otpm: 100000, max_concurrency: 64, weight: 2, priority: [0, 5]}\n"
        "  beta-2: {max_queued_tokens: 5000}\n"
    )
    policies = Policies.load(path)
    assert policies.default == TenantPolicy(itpm=200_000, otpm=20_000)
    acme = policies.for_tenant("acme")
    assert acme is not None
    assert (acme.itpm, acme.otpm, acme.max_concurrency) == (1_000_000, 100_000, 64)
    assert acme.weight == 2.0
    assert acme.priority == (0, 5)
    beta = policies.for_tenant("beta-2")
    assert beta is not None
    assert beta.max_queued_tokens == 5_000
    assert beta.itpm == TenantPolicy().itpm  # field defaults, not the `default:` tenant's
    assert policies.for_tenant("nobody") == policies.default


def test_empty_policy_file_refuses_every_tenant(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    policies = Policies.load(path)
    assert policies.default is None
    assert policies.for_tenant("acme") is None


@pytest.mark.parametrize(
    "text",
    [
        "tenants:\n  acme: {itpm: 0}\n",
        "tenants:\n  acme: {otpm: -5}\n",
        "tenants:\n  acme: {weight: 0}\n",
        "tenants:\n  acme: {max_concurrency: 0}\n",
        "tenants:\n  acme: {priority: [5, 2]}\n",
        "tenants:\n  acme: {priority: [0, 10]}\n",
        "tenants:\n  acme: {priority: [1, 2, 3]}\n",
        "tenants:\n  acme: {itpm: lots}\n",
        "tenants:\n  acme: {tpm: 1000}\n",  # unknown key: a typo must not be ignored
        "defaults:\n  itpm: 1000\n",
        "tenants:\n  Not A Tenant!: {itpm: 1000}\n",
        "- acme\n- beta\n",
        "tenants: [acme\n",  # not YAML
    ],
)
def test_bad_policy_file_is_a_clear_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(text)
    with pytest.raises(SwitchyardError) as info:
        Policies.load(path)
    assert info.value.code == "invalid_request"
    assert str(path) in info.value.reason


def test_missing_policy_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(SwitchyardError) as info:
        Policies.load(path)
    assert str(path) in info.value.reason
