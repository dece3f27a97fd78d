"""ARCO (docs/methods/arco.md): a rubric model with generation and score heads, co-trained with the policy.

- ``rubric_model``, ``model_setup``: mu, one backbone with a LoRA and two heads, and what it is built on
- ``criteria``: the step view, mu's criteria prompt and the teacher's warm-up annotation
- ``decomposition``: step rewards that sum to the outcome, and the step advantages
- ``probe``: mu's step credit against the world oracle on fixed trajectories (stage ``arco_probe``)
- ``variants``: ``train_policy@arco``, ``@arco_frozen``, ``@arco_no_decomp``
- ``params``, ``plugin``: its params section and its registration
"""
