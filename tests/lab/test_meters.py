from redpack.lab.meters import MachineTimes, machine_shares, machine_times


def test_the_machines_shares_are_of_the_time_between_two_readings():
    before = MachineTimes(total=1_000.0, idle=400.0, steal=10.0)
    after = MachineTimes(total=1_020.0, idle=402.0, steal=12.4)

    shares = machine_shares(before, after)

    # 20 s of CPU time passed: 2 idle (busy 90%), 2.4 taken by the hypervisor (12%).
    assert shares == {"machine_busy_share": 0.9, "steal_share": 0.12}


def test_no_time_between_the_readings_gives_no_shares():
    same = MachineTimes(total=5.0, idle=1.0, steal=0.0)

    assert machine_shares(same, same) == {"machine_busy_share": None, "steal_share": None}


def test_this_machines_reading_adds_up():
    first = machine_times()
    sum(range(200_000))  # some CPU time passes
    second = machine_times()

    assert 0 <= second.idle + second.steal <= second.total
    assert second.total >= first.total and second.steal >= first.steal
    shares = machine_shares(first, second)
    assert shares["steal_share"] is None or 0 <= shares["steal_share"] <= 1
