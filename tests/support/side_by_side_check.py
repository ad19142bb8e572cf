"""Run in a fresh process by test_remote_code_isolation.py: two exported copies of every LM load as remote code
before energyzoo is imported, then energyzoo itself loads the same weights; all of them generate and train, in turns,
in one process, and must give what the test computed beforehand in its own process."""

import sys

import torch
import transformers

payload = torch.load(sys.argv[1], weights_only=False)
models = {}
for name, case in payload.items():
    for copy in ("a", "b"):
        models[name, copy] = transformers.AutoModelForCausalLM.from_pretrained(case["folders"][copy],
                                                                               trust_remote_code=True)
        assert type(models[name, copy]).__module__.startswith("transformers_modules."), type(models[name, copy])
import energyzoo  # noqa: E402,F401  (registers the package's classes, which win over remote code from here on)

for name, case in payload.items():
    models[name, "package"] = transformers.AutoModelForCausalLM.from_pretrained(case["folders"]["a"])
    assert type(models[name, "package"]).__module__.startswith("energyzoo."), type(models[name, "package"])
for copy in ("a", "b", "package", "a"):  # in turns: each copy's cache classes meet the others' registrations
    for name, case in payload.items():
        model = models[name, copy].eval()
        generated = model.generate(**case["prompts"], **case["generation"])
        assert torch.equal(generated, case["generated"]), (name, copy, generated, case["generated"])
for copy in ("a", "b", "package"):
    for name, case in payload.items():
        model = models[name, copy].train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = model(**case["batch"]).loss
        loss.backward()
        optimizer.step()
        torch.testing.assert_close(loss.detach(), case["loss"], rtol=1e-5, atol=1e-6, msg=f"{name} {copy}")
        with torch.no_grad():
            trained = model.eval()(**case["prompts"]).logits
        torch.testing.assert_close(trained, case["trained_logits"], rtol=1e-4, atol=1e-5, msg=f"{name} {copy}")
print("SIDE_BY_SIDE_OK", len(models))
