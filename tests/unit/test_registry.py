"""The encode method registry (featpipe.encode.registry): one method loads its own module, and
the index of modules and method names agrees with what the modules define."""

import pytest

from featpipe.encode import registry


def test_load_method_gives_the_method_load_methods_lists():
    methods = registry.load_methods()
    assert sorted(methods) == sorted(n for names in registry.METHOD_MODULES.values()
                                     for n in names)
    for name, method in methods.items():
        assert registry.load_method(name) is method
    with pytest.raises(KeyError):
        registry.load_method("no-such-method")


def test_a_method_index_that_disagrees_with_its_module_is_an_error(monkeypatch):
    monkeypatch.setitem(registry.METHOD_MODULES, "featpipe.encode.fisher", ("fisher", "vlad"))
    with pytest.raises(RuntimeError, match=r"featpipe.encode.fisher defines the encode "
                                           r"methods \('fisher',\), but METHOD_MODULES lists"):
        registry.load_method("fisher")
