"""A mixed fleet: RTX PRO 6000 (SM120), B200 (SM100) and H200 (SM90) groups.

Group data lives in inventories/group_data/<group>.py and differs by arch; every host shares
inventories/group_data/all.py. The addresses are documentation examples (RFC 5737).

Run: python -m specfleet.fleet.rollout inventories/fleet_example.py deploys/kimi_k26.py
"""

rtx6000 = [
    ("rtx-a1", {"ssh_hostname": "192.0.2.11"}),
    ("rtx-a2", {"ssh_hostname": "192.0.2.12"}),
]

b200 = [
    ("b200-01", {"ssh_hostname": "192.0.2.21"}),
    ("b200-02", {"ssh_hostname": "192.0.2.22"}),
    ("b200-03", {"ssh_hostname": "192.0.2.23"}),
    ("b200-04", {"ssh_hostname": "192.0.2.24"}),
]

h200 = [
    # 2x H200 would be too small for K2.6: preflight says so before anything changes.
    ("h200-01", {"ssh_hostname": "192.0.2.31", "specfleet": {"port": 30001}}),
]

# A serving group: two 8x H100 hosts run one server, tensor parallel over their 16 GPUs
# (inventories/group_data/h100_pair.py declares the group once, for both).
h100_pair = [
    ("h100-01", {"ssh_hostname": "192.0.2.41"}),
    ("h100-02", {"ssh_hostname": "192.0.2.42"}),
]
