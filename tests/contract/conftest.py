from django.conf import settings


def pytest_generate_tests(metafunc):  # type: ignore[no-untyped-def]
    """Every registered safe strategy joins the contract by being registered."""
    if "safe_strategy" in metafunc.fixturenames:
        from strategies import registry

        names = [n for n in settings.REDPACK_STRATEGIES if registry.get(n).safe]
        metafunc.parametrize("safe_strategy", names)
