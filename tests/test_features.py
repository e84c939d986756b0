"""The feature registry (``streameval.features``): Settings is built from it, and gives back the
options it was parsed from; each feature adds its statistic to the scoring pass, and to a saved
state's key what its arrays depend on, and nothing when it is off."""

from __future__ import annotations

import pytest

from streameval.engine.metadata import Metadata
from streameval.run.settings import Settings

OPEN_SET = {"fpir": ["0.05"], "ranks": [1, 3], "rounding": "floor"}
EVERY_FEATURE = {"gom_norm": "fixed:0:2", "gom_bins": 64, "gom_b": 500, "gom_vp": "jaccard",
                 "ranked": {"k": 7, "trial": 0, "with_junk": True}, "open_set": OPEN_SET,
                 "verification": {"far": ["0.01"], "auc": True, "hist_bits": 12, "core": 0}}  # core: the store sizes it


@pytest.mark.parametrize("options", [
    {},
    {"no_gom": True},
    EVERY_FEATURE,
    {"protocol": "sysu-all", "trials": 0, "max_rank": 20, "no_gom": True, "open_set": OPEN_SET},
], ids=["defaults", "no-gom", "every-feature", "identity-dedup"])
def test_the_options_settings_give_back_parse_to_the_same_settings(options):
    settings = Settings.parse(None, metric="cosine", **options)
    assert Settings.parse(None, **settings.to_options()) == settings


def statistic_names(settings: Settings) -> list[str]:
    return [stat.name for stat in settings.statistics(Metadata(), dim=4)]


def test_each_feature_on_adds_its_statistic_and_its_state_key():
    settings = Settings.parse(None, metric="cosine", **EVERY_FEATURE)
    assert statistic_names(settings) == ["slots", "gom", "topk", "nearest", "verify"]
    key = settings.state_key()
    assert key["gom"] == {"norm": "fixed", "lo": 0.0, "hi": 2.0, "bins": 64}  # B and vp only shape the report
    assert key["ranked"] == settings.ranked.to_record()
    assert key["open_set"] is True  # targets and ranks only shape the report
    assert key["verification"] == {"hist_bits": 12, "core": 0, "auc": True}
    assert "max_rank" not in key  # only an identity-dedup state is max_rank long


def test_features_off_add_nothing_but_the_closed_set_counts():
    settings = Settings.parse(None, metric="cosine", no_gom=True)
    assert statistic_names(settings) == ["slots"]
    assert settings.state_key() == {"metric": "cosine", "protocol": settings.protocol.to_record(),
                                    "precision": "float32", "gom": None}


def test_the_protocol_turns_on_its_cmc_flavours():
    dedup = Settings.parse(None, metric="cosine", protocol="sysu-all", trials=0, max_rank=20, no_gom=True)
    assert statistic_names(dedup) == ["slots", "dedup"] and dedup.state_key()["max_rank"] == 20
    sgs = Settings.parse(None, metric="cosine", protocol="cuhk03-sgs", sgs_mode="sampled", no_gom=True)
    assert statistic_names(sgs) == ["slots", "sgs_sampled"]


def test_an_option_no_feature_takes_is_refused():
    with pytest.raises(TypeError, match="unexpected keyword argument.*gom_bin\\b"):
        Settings.parse(None, metric="cosine", gom_bin=64)
