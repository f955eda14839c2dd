"""Licence ids from model cards: SPDX form, the name shown at start-up, and non-commercial marking."""

import json

import pytest

from recipekit.drafters.cli import main
from recipekit.drafters.errors import Refused
from recipekit.drafters.licence import licence_from_id, read_licence
from tests.unit.test_drafter_synthetic import make_dflash2_g


@pytest.mark.parametrize(
    "hub_id, spdx, name, non_commercial",
    [
        ("cc-by-nc-nd-4.0", "CC-BY-NC-ND-4.0", "CC BY-NC-ND 4.0", True),
        ("CC-BY-NC-4.0", "CC-BY-NC-4.0", "CC BY-NC 4.0", True),
        ("cc-by-nc-sa-4.0", "CC-BY-NC-SA-4.0", "CC BY-NC-SA 4.0", True),
        ("cc-by-4.0", "CC-BY-4.0", "CC BY 4.0", False),
        ("cc-by-nd-4.0", "CC-BY-ND-4.0", "CC BY-ND 4.0", False),
        ("apache-2.0", "Apache-2.0", "Apache-2.0", False),
        ("mit", "MIT", "MIT", False),
    ],
)
def test_known_ids(hub_id, spdx, name, non_commercial):
    licence = licence_from_id(hub_id)
    assert (licence.spdx, licence.name, licence.non_commercial, licence.recognised) == (
        spdx,
        name,
        non_commercial,
        True,
    )


def test_unknown_ids_are_kept_verbatim_and_marked_unrecognised():
    assert licence_from_id("acme-research-nc").non_commercial is True
    custom = licence_from_id("acme-open")
    assert (custom.spdx, custom.non_commercial, custom.recognised) == ("acme-open", False, False)


def test_other_uses_license_name(tmp_path):
    (tmp_path / "README.md").write_text(
        "---\nlicense: other\nlicense_name: acme-nc-1.0\n---\nbody\n"
    )
    licence = read_licence(tmp_path)
    assert (licence.spdx, licence.non_commercial, licence.recognised) == (
        "acme-nc-1.0",
        True,
        False,
    )


def test_front_matter_that_is_not_yaml_is_refused(tmp_path):
    (tmp_path / "README.md").write_text("---\nlicense: [unclosed\n---\nbody\n")
    with pytest.raises(Refused) as refusal:
        read_licence(tmp_path)
    assert refusal.value.field == "front matter" and "README.md" in str(refusal.value)


def test_startup_line_warns_of_an_unrecognised_licence(tmp_path, capsys):
    snapshot = make_dflash2_g(tmp_path)
    (snapshot / "README.md").write_text("---\nlicense: acme-open\n---\n")
    # the catalog check applies only to a recognised published repo id, so name it otherwise
    plain = tmp_path / "local-drafter"
    snapshot.rename(plain)
    assert main([str(plain), "--out", str(tmp_path / "served"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["startup"].startswith(
        "local-drafter (acme-open, licence not recognised: read its terms), "
    )
    assert summary["licence_recognised"] is False
