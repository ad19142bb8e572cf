"""Evaluation: lm-evaluation-harness suites (`harness`, `suites`), the speed benchmark (`speed`), the kernel and
family checks of `energyzoo doctor` (`kernels`, `families`, `task_inputs`) and the GPU check (`gpu_check`)."""
