"""`localflash serve` shortens OpenMP's spin before llama.cpp loads, and leaves a user's own choice alone."""

from localflash.llama.bindings import SERVER_OMP_SPIN, short_omp_spin


def test_short_spin_is_set_when_the_user_chose_none():
    env = {}
    assert short_omp_spin(env, loaded=False) == str(SERVER_OMP_SPIN)
    assert env == {"GOMP_SPINCOUNT": str(SERVER_OMP_SPIN)}


def test_a_users_spin_count_or_wait_policy_is_kept():
    for given in ({"GOMP_SPINCOUNT": "300000"}, {"OMP_WAIT_POLICY": "active"}):
        env = dict(given)
        assert short_omp_spin(env, loaded=False) is None
        assert env == given


def test_nothing_is_set_once_llama_cpp_has_loaded():
    env = {}
    assert short_omp_spin(env, loaded=True) is None  # libgomp read its environment already
    assert env == {}
