from eurekaclaw.learning.loop import ContinualLearningLoop

__all__ = ["ContinualLearningLoop"]
