import pytest

from components.registry import Registry, RegistryError


def test_register_get_and_refuse_overwrite():
    reg = Registry("thing")

    @reg.register("a")
    def a():
        return 1

    assert reg.get("a") is a
    reg.register("a")(a)  # the same object again is fine
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("a")(lambda: 2)
    with pytest.raises(RegistryError, match="unknown thing 'b'"):
        reg.get("b")


def test_dotted_import_path_escape_hatch():
    reg = Registry("thing")
    import json

    assert reg.get("json:dumps") is json.dumps
    assert reg.get("json.loads") is json.loads
    with pytest.raises(RegistryError, match="cannot import"):
        reg.get("json:nope")
