// The IBVERBS_1.0 versions of the verbs: the ABI of libibverbs 1.0, whose
// objects were other structures (rdma-core keeps them as *_1_0 wrappers).
// Programs built since libibverbs 1.1 (2007) bind the IBVERBS_1.1 versions;
// softroce does not carry the old structures, so each 1.0 entry point
// refuses with ENOSYS (NULL, -1 or the errno value, as the verb reports
// errors) and the release ones do nothing. The 1.1 versions are in verbs.c.
#include <errno.h>
#include <stdint.h>

#include "sr.h"

#define SR_COMPAT(name) __asm__(".symver " #name "_1_0, " #name "@IBVERBS_1.0")

#define SR_COMPAT_PTR(name)                   \
	SR_EXPORT void *name##_1_0(void);     \
	void *name##_1_0(void)                \
	{                                     \
		errno = ENOSYS;               \
		return NULL;                  \
	}                                     \
	SR_COMPAT(name);

#define SR_COMPAT_ERR(name)                   \
	SR_EXPORT int name##_1_0(void);       \
	int name##_1_0(void)                  \
	{                                     \
		errno = ENOSYS;               \
		return ENOSYS;                \
	}                                     \
	SR_COMPAT(name);

#define SR_COMPAT_NEG(name)                   \
	SR_EXPORT int name##_1_0(void);       \
	int name##_1_0(void)                  \
	{                                     \
		errno = ENOSYS;               \
		return -1;                    \
	}                                     \
	SR_COMPAT(name);

#define SR_COMPAT_VOID(name)                  \
	SR_EXPORT void name##_1_0(void);      \
	void name##_1_0(void) {}              \
	SR_COMPAT(name);

SR_EXPORT uint64_t ibv_get_device_guid_1_0(void);
uint64_t ibv_get_device_guid_1_0(void)
{
	errno = ENOSYS;
	return 0;
}
SR_COMPAT(ibv_get_device_guid);

// ibv_register_driver (IBVERBS_1.1, compat only) registered a pre-rdma-core
// provider; there are no providers to load here, so it is ignored.
SR_EXPORT void ibv_register_driver_1_1(void);
void ibv_register_driver_1_1(void) {}
__asm__(".symver ibv_register_driver_1_1, ibv_register_driver@IBVERBS_1.1");

SR_COMPAT_VOID(ibv_ack_async_event)
SR_COMPAT_VOID(ibv_ack_cq_events)
SR_COMPAT_PTR(ibv_alloc_pd)
SR_COMPAT_ERR(ibv_attach_mcast)
SR_COMPAT_ERR(ibv_close_device)
SR_COMPAT_PTR(ibv_create_ah)
SR_COMPAT_PTR(ibv_create_cq)
SR_COMPAT_PTR(ibv_create_qp)
SR_COMPAT_PTR(ibv_create_srq)
SR_COMPAT_ERR(ibv_dealloc_pd)
SR_COMPAT_ERR(ibv_dereg_mr)
SR_COMPAT_ERR(ibv_destroy_ah)
SR_COMPAT_ERR(ibv_destroy_cq)
SR_COMPAT_ERR(ibv_destroy_qp)
SR_COMPAT_ERR(ibv_destroy_srq)
SR_COMPAT_ERR(ibv_detach_mcast)
SR_COMPAT_VOID(ibv_free_device_list)
SR_COMPAT_NEG(ibv_get_async_event)
SR_COMPAT_NEG(ibv_get_cq_event)
SR_COMPAT_PTR(ibv_get_device_list)
SR_COMPAT_PTR(ibv_get_device_name)
SR_COMPAT_ERR(ibv_modify_qp)
SR_COMPAT_ERR(ibv_modify_srq)
SR_COMPAT_PTR(ibv_open_device)
SR_COMPAT_ERR(ibv_query_device)
SR_COMPAT_ERR(ibv_query_gid)
SR_COMPAT_ERR(ibv_query_pkey)
SR_COMPAT_ERR(ibv_query_port)
SR_COMPAT_ERR(ibv_query_qp)
SR_COMPAT_ERR(ibv_query_srq)
SR_COMPAT_PTR(ibv_reg_mr)
SR_COMPAT_ERR(ibv_resize_cq)
