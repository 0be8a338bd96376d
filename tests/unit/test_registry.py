"""The encode method registry (featpipe.encode.registry): one method loads its own module, and
the index of modules and method names agrees with what the modules define."""

import pytest

from featpipe.encode import registry


def test_load_method_gives_the_method_load_methods_lists():
    methods = registry.load_methods()
    assert sorted(methods) == sorted(n for names in registry.METHOD_MODULES.values()
                                     for n in names)
    for name, method in methods.items():  # the same method, from its table where it has one
        alone = registry.load_method(name)
        assert (alone.name, alone.summary, alone.fixed, alone.batch_size) == \
            (method.name, method.summary, method.fixed, method.batch_size)
        assert [(p.name, p.default, p.required) for p in alone.parameters] == \
            [(p.name, p.default, p.required) for p in method.parameters]
    with pytest.raises(KeyError):
        registry.load_method("no-such-method")


def test_a_method_index_that_disagrees_with_its_module_is_an_error(monkeypatch):
    monkeypatch.setitem(registry.METHOD_MODULES, "featpipe.encode.fisher", ("fisher", "vlad"))
    with pytest.raises(RuntimeError, match=r"featpipe.encode.fisher defines the encode "
                                           r"methods \('fisher',\), but METHOD_MODULES lists"):
        registry.load_method("fisher")


def test_a_method_registered_twice_is_an_error_naming_the_second_module():
    from types import SimpleNamespace

    from featpipe.settings import registry

    first, again = SimpleNamespace(name="avg"), SimpleNamespace(name="avg")
    assert registry([("mod_a", [first])], "encode method") == {"avg": first}
    with pytest.raises(RuntimeError, match=r"encode method 'avg' is registered twice "
                                           r"\(again by mod_b\)"):
        registry([("mod_a", [first]), ("mod_b", [again])], "encode method")
