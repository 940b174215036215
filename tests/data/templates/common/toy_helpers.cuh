// toy_helpers.cuh — a common header of the test template tree.
#pragma once
