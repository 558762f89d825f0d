"""Fine-tuning, knowledge distillation and batch prediction of ALBERT sequence classifiers on Ray.

config: job configs · data: labelled tables → token arrays · task: the fine-tuning TrainingTask · lr_groups:
ALBERT-aware learning rates · metrics · inference: in-process logits, metrics, throughput · job: the fine-tuning
driver · distill: teacher → student · predict: batch prediction.
"""
