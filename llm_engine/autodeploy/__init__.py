"""AutoDeploy: serve any Hugging Face causal LM without a hand-written model file.

`capture` builds the model from its config.json with Transformers' own code (parameters on the
meta device) and exports its forward with torch.export; `passes` rewrite that graph onto the
engine's layers (paged attention over the KV pool, fused norms/projections/activations,
QuantMethod linears); `AutoDeployedCausalLM` is the result, built and loaded like a registered
model so the scheduler, prefix cache and preemption work unchanged.
"""
