"""knorm in Python: keep the keys of smallest L2 norm (kvpress' KnormPress; the built-in knorm).

    kvlab.register_policy("knorm_py", KNorm)   # then kv_cache.name "knorm_py-default"
"""
POLICY_NAME = "knorm_py"


class KNorm:
    """knorm in Python: a slot's score is minus its key's L2 norm"""

    needs = ("key_norm",)

    def score(self, f):
        return -f.key_norm
