// libibverbs' private interface (version node IBVERBS_PRIVATE_34), the one
// rdma-core's provider libraries (libmlx5, libefa, ...) link against. softroce
// has no kernel provider to drive, but programs such as pyverbs load those
// providers' modules, and the dynamic linker refuses a provider whose
// private symbols are missing. So every symbol exists and refuses: commands
// fail with EOPNOTSUPP, allocators return NULL with errno EOPNOTSUPP, and a
// provider that registers itself is ignored (its devices never appear:
// ibv_get_device_list lists the daemon's devices only). ibv_query_gid_type,
// which pyverbs calls, answers for softroce's devices.
//
// The prototypes are private to rdma-core (driver.h, not installed); these
// stubs take no arguments, which is ABI-compatible with any caller on the
// SysV ABIs for the return types used here.
#include <errno.h>
#include <stdbool.h>

#include "sr.h"

// verbs_allow_disassociate_destroy is a flag providers read; softroce never
// disassociates a device, so it stays false.
SR_EXPORT bool verbs_allow_disassociate_destroy;

#define SR_REFUSE_INT(name)         \
	SR_EXPORT int name(void);   \
	int name(void)              \
	{                           \
		errno = EOPNOTSUPP; \
		return EOPNOTSUPP;  \
	}

#define SR_REFUSE_PTR(name)         \
	SR_EXPORT void *name(void); \
	void *name(void)            \
	{                           \
		errno = EOPNOTSUPP; \
		return NULL;        \
	}

#define SR_IGNORE(name)            \
	SR_EXPORT void name(void); \
	void name(void) {}

// ibv_query_gid_type is the one private verb programs use directly (pyverbs'
// Context.query_gid_type): every GID of a softroce device is RoCE v2
// (IBV_GID_TYPE_SYSFS_ROCE_V2 = 1 in rdma-core's driver.h).
SR_EXPORT int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
				 unsigned int *type);
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
		       unsigned int *type)
{
	struct sr_context *sc = sr_ctx(context);
	if (port_num != 1 || index >= (unsigned int)sc->info.port.gid_tbl_len) {
		errno = EINVAL;
		return EINVAL;
	}
	*type = 1;
	return 0;
}

// ibv_read_ibdev_sysfs_file returns a byte count, so it refuses with -1.
SR_EXPORT int ibv_read_ibdev_sysfs_file(void);
int ibv_read_ibdev_sysfs_file(void)
{
	errno = EOPNOTSUPP;
	return -1;
}

// __ioctl_final_num_attrs sizes a kernel ioctl command buffer; no command is
// ever built here.
SR_EXPORT unsigned int __ioctl_final_num_attrs(void);
unsigned int __ioctl_final_num_attrs(void)
{
	return 0;
}


SR_REFUSE_INT(execute_ioctl)
SR_REFUSE_INT(ibv_cmd_advise_mr)
SR_REFUSE_INT(ibv_cmd_alloc_dm)
SR_REFUSE_INT(ibv_cmd_alloc_mw)
SR_REFUSE_INT(ibv_cmd_alloc_pd)
SR_REFUSE_INT(ibv_cmd_attach_mcast)
SR_REFUSE_INT(ibv_cmd_close_xrcd)
SR_REFUSE_INT(ibv_cmd_create_ah)
SR_REFUSE_INT(ibv_cmd_create_counters)
SR_REFUSE_INT(ibv_cmd_create_cq)
SR_REFUSE_INT(ibv_cmd_create_cq_ex)
SR_REFUSE_INT(ibv_cmd_create_flow)
SR_REFUSE_INT(ibv_cmd_create_flow_action_esp)
SR_REFUSE_INT(ibv_cmd_create_qp)
SR_REFUSE_INT(ibv_cmd_create_qp_ex)
SR_REFUSE_INT(ibv_cmd_create_qp_ex2)
SR_REFUSE_INT(ibv_cmd_create_rwq_ind_table)
SR_REFUSE_INT(ibv_cmd_create_srq)
SR_REFUSE_INT(ibv_cmd_create_srq_ex)
SR_REFUSE_INT(ibv_cmd_create_wq)
SR_REFUSE_INT(ibv_cmd_dealloc_mw)
SR_REFUSE_INT(ibv_cmd_dealloc_pd)
SR_REFUSE_INT(ibv_cmd_dereg_mr)
SR_REFUSE_INT(ibv_cmd_destroy_ah)
SR_REFUSE_INT(ibv_cmd_destroy_counters)
SR_REFUSE_INT(ibv_cmd_destroy_cq)
SR_REFUSE_INT(ibv_cmd_destroy_flow)
SR_REFUSE_INT(ibv_cmd_destroy_flow_action)
SR_REFUSE_INT(ibv_cmd_destroy_qp)
SR_REFUSE_INT(ibv_cmd_destroy_rwq_ind_table)
SR_REFUSE_INT(ibv_cmd_destroy_srq)
SR_REFUSE_INT(ibv_cmd_destroy_wq)
SR_REFUSE_INT(ibv_cmd_detach_mcast)
SR_REFUSE_INT(ibv_cmd_free_dm)
SR_REFUSE_INT(ibv_cmd_get_context)
SR_REFUSE_INT(ibv_cmd_modify_cq)
SR_REFUSE_INT(ibv_cmd_modify_flow_action_esp)
SR_REFUSE_INT(ibv_cmd_modify_qp)
SR_REFUSE_INT(ibv_cmd_modify_qp_ex)
SR_REFUSE_INT(ibv_cmd_modify_srq)
SR_REFUSE_INT(ibv_cmd_modify_wq)
SR_REFUSE_INT(ibv_cmd_open_qp)
SR_REFUSE_INT(ibv_cmd_open_xrcd)
SR_REFUSE_INT(ibv_cmd_poll_cq)
SR_REFUSE_INT(ibv_cmd_post_recv)
SR_REFUSE_INT(ibv_cmd_post_send)
SR_REFUSE_INT(ibv_cmd_post_srq_recv)
SR_REFUSE_INT(ibv_cmd_query_context)
SR_REFUSE_INT(ibv_cmd_query_device_any)
SR_REFUSE_INT(ibv_cmd_query_mr)
SR_REFUSE_INT(ibv_cmd_query_port)
SR_REFUSE_INT(ibv_cmd_query_qp)
SR_REFUSE_INT(ibv_cmd_query_srq)
SR_REFUSE_INT(ibv_cmd_read_counters)
SR_REFUSE_INT(ibv_cmd_reg_dm_mr)
SR_REFUSE_INT(ibv_cmd_reg_dmabuf_mr)
SR_REFUSE_INT(ibv_cmd_reg_mr)
SR_REFUSE_INT(ibv_cmd_req_notify_cq)
SR_REFUSE_INT(ibv_cmd_rereg_mr)
SR_REFUSE_INT(ibv_cmd_resize_cq)

SR_REFUSE_PTR(_verbs_init_and_alloc_context)
SR_REFUSE_PTR(verbs_open_device)

SR_IGNORE(__verbs_log)
SR_IGNORE(verbs_register_driver_34)
SR_IGNORE(verbs_set_ops)
SR_IGNORE(verbs_init_cq)
SR_IGNORE(verbs_uninit_context)
